//! The guest's clocks: the host's real ones, or, in deterministic mode, one virtual clock.
//!
//! The virtual clock starts at [`VIRTUAL_EPOCH_SECS`] (wall) and 0 (monotonic) in every
//! instance and moves only by a fixed rule: each reading of either clock advances it by
//! [`TICK_NANOS`] (so time still passes for code that waits for it to), and a sleep advances
//! it by the time asked for and returns at once. Both clocks read the same counter, so
//! `time.sleep(5)` moves `time.time()` and `time.monotonic()` by 5 s alike. Nothing here
//! depends on the host's time or load.

use std::time::Duration;

use wasmtime::component::{HasData, Resource};
use wasmtime_wasi::clocks::WasiClocksCtxView;
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock::{
    self, Duration as WasiDuration, Instant,
};
use wasmtime_wasi::p2::bindings::clocks::wall_clock::{self, Datetime};
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};

use super::state::RunState;

/// The wall time a deterministic instance starts at: 2000-01-01T00:00:00Z.
pub(crate) const VIRTUAL_EPOCH_SECS: u64 = 946_684_800;

/// How far one reading of a virtual clock moves it: 1 µs.
pub(crate) const TICK_NANOS: u64 = 1_000;

/// One instance's virtual time, in nanoseconds since the instance started.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VirtualClock {
    nanos: u64,
}

impl VirtualClock {
    /// Reads the clock, then moves it on by one tick.
    fn read(&mut self) -> u64 {
        let now = self.nanos;
        self.nanos = self.nanos.saturating_add(TICK_NANOS);
        now
    }

    /// A sleep of `nanos`: time moves on by that much (and never backwards).
    fn sleep(&mut self, nanos: u64) {
        self.nanos = self.nanos.saturating_add(nanos);
    }

    /// A sleep until the monotonic instant `until`.
    fn sleep_until(&mut self, until: u64) {
        self.nanos = self.nanos.max(until);
    }

    fn wall(&mut self) -> Datetime {
        let since = Duration::from_nanos(self.read());
        Datetime {
            seconds: VIRTUAL_EPOCH_SECS + since.as_secs(),
            nanoseconds: since.subsec_nanos(),
        }
    }
}

/// What the clock interfaces are linked to: the host's clocks, or the instance's virtual one.
pub(crate) struct GuestClocks;

impl HasData for GuestClocks {
    type Data<'a> = ClocksView<'a>;
}

pub(crate) struct ClocksView<'a> {
    real: WasiClocksCtxView<'a>,
    virtual_clock: Option<&'a mut VirtualClock>,
}

impl RunState {
    pub(crate) fn guest_clocks(&mut self) -> ClocksView<'_> {
        ClocksView {
            real: WasiClocksCtxView {
                ctx: self.wasi.clocks(),
                table: &mut self.table,
            },
            virtual_clock: self.virtual_clock.as_mut(),
        }
    }
}

/// A pollable that is ready at once: a virtual sleep has already happened.
struct Elapsed;

#[wasmtime_wasi::async_trait]
impl Pollable for Elapsed {
    async fn ready(&mut self) {}
}

impl ClocksView<'_> {
    fn elapsed(&mut self) -> wasmtime::Result<Resource<DynPollable>> {
        let elapsed = self.real.table.push(Elapsed)?;
        subscribe(self.real.table, elapsed)
    }
}

impl wall_clock::Host for ClocksView<'_> {
    fn now(&mut self) -> wasmtime::Result<Datetime> {
        match &mut self.virtual_clock {
            Some(clock) => Ok(clock.wall()),
            None => wall_clock::Host::now(&mut self.real),
        }
    }

    fn resolution(&mut self) -> wasmtime::Result<Datetime> {
        match &self.virtual_clock {
            Some(_) => Ok(Datetime {
                seconds: 0,
                nanoseconds: TICK_NANOS as u32,
            }),
            None => wall_clock::Host::resolution(&mut self.real),
        }
    }
}

impl monotonic_clock::Host for ClocksView<'_> {
    fn now(&mut self) -> wasmtime::Result<Instant> {
        match &mut self.virtual_clock {
            Some(clock) => Ok(clock.read()),
            None => monotonic_clock::Host::now(&mut self.real),
        }
    }

    fn resolution(&mut self) -> wasmtime::Result<Instant> {
        match &self.virtual_clock {
            Some(_) => Ok(TICK_NANOS),
            None => monotonic_clock::Host::resolution(&mut self.real),
        }
    }

    fn subscribe_instant(&mut self, when: Instant) -> wasmtime::Result<Resource<DynPollable>> {
        match &mut self.virtual_clock {
            Some(clock) => {
                clock.sleep_until(when);
                self.elapsed()
            }
            None => monotonic_clock::Host::subscribe_instant(&mut self.real, when),
        }
    }

    fn subscribe_duration(
        &mut self,
        duration: WasiDuration,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        match &mut self.virtual_clock {
            Some(clock) => {
                clock.sleep(duration);
                self.elapsed()
            }
            None => monotonic_clock::Host::subscribe_duration(&mut self.real, duration),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_time_moves_by_reads_and_sleeps_only() {
        let mut clock = VirtualClock::default();
        assert_eq!(clock.read(), 0);
        assert_eq!(clock.read(), TICK_NANOS);
        clock.sleep(5_000_000_000);
        assert_eq!(clock.read(), 2 * TICK_NANOS + 5_000_000_000);
        clock.sleep_until(10);
        assert_eq!(
            clock.read(),
            3 * TICK_NANOS + 5_000_000_000,
            "never backwards"
        );
        let wall = clock.wall();
        assert_eq!(wall.seconds, VIRTUAL_EPOCH_SECS + 5);
        assert_eq!(wall.nanoseconds, 4 * TICK_NANOS as u32);
    }
}
