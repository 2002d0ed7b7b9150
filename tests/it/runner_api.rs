//! The Runner's own rules, independent of any real sandbox.

use std::sync::Arc;
use std::time::Duration;

use pycage::backend::RunFuture;
use pycage::{Availability, Backend, BuildError, Job, RunError, RunResult, Runner, ToolGate};

/// A backend that isolates nothing and runs nothing: it only records that it was asked.
struct Bare;

impl Backend for Bare {
    fn name(&self) -> &'static str {
        "bare"
    }
    fn provides_isolation(&self) -> bool {
        false
    }
    fn availability(&self) -> Availability {
        Availability::Available
    }
    fn run(&self, job: Job, _gate: Arc<dyn ToolGate>) -> RunFuture<'_> {
        Box::pin(async move {
            RunResult::failed(
                "bare",
                RunError::new(
                    pycage::ErrorKind::GuestException,
                    format!("saw {} bytes", job.code.len()),
                ),
                Duration::ZERO,
            )
        })
    }
}

#[test]
fn a_backend_without_isolation_is_refused_by_default() {
    let err = Runner::builder()
        .backend(Arc::new(Bare))
        .build()
        .unwrap_err();
    assert!(matches!(err, BuildError::NoIsolation("bare")), "{err}");
    assert!(err.to_string().contains("no isolation"));
}

#[tokio::test]
async fn allow_no_isolation_lets_it_through() {
    let runner = Runner::builder()
        .backend(Arc::new(Bare))
        .allow_no_isolation(true)
        .build()
        .unwrap();
    let r = runner.run("abc").await;
    assert_eq!(r.error.unwrap().message, "saw 3 bytes");
    assert_eq!(r.tool_calls, 0);
}

#[test]
fn a_policy_that_does_not_resolve_fails_the_build() {
    let err = Runner::builder()
        .backend(Arc::new(Bare))
        .allow_no_isolation(true)
        .policy(pycage::ToolPolicy::new().namespace("math"))
        .build()
        .unwrap_err();
    assert!(matches!(err, BuildError::Policy(_)), "{err}");
}
