//! Percentiles over samples.

use serde::Serialize;

/// Percentiles of a set of samples, in the row's unit.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub n: usize,
    pub p50: f64,
    pub p99: f64,
    pub min: f64,
    pub mean: f64,
}

impl Summary {
    /// Summarises samples (which must not be empty).
    pub fn of(mut samples: Vec<f64>) -> Summary {
        assert!(!samples.is_empty(), "a summary needs samples");
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        let at = |q: f64| samples[((n as f64 - 1.0) * q).round() as usize];
        Summary {
            n,
            p50: at(0.50),
            p99: at(0.99),
            min: samples[0],
            mean: samples.iter().sum::<f64>() / n as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_set() {
        let s = Summary::of((1..=100).map(f64::from).rev().collect());
        assert_eq!((s.n, s.min, s.p50, s.p99), (100, 1.0, 51.0, 99.0));
        assert_eq!(s.mean, 50.5);
        let one = Summary::of(vec![7.0]);
        assert_eq!((one.p50, one.p99), (7.0, 7.0));
    }
}
