//! The session manager's bookkeeping, over a backend whose sessions count their runs.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::backend::{Availability, Backend, BackendSession, Job, RunFuture, SessionFuture};
use crate::broker::ToolGate;

/// A backend whose session guests answer each run with how many runs they have seen; code
/// `end` ends the session, code `slow` takes a minute.
struct Counting;

struct CountingSession(u64);

impl BackendSession for CountingSession {
    fn run(&mut self, job: Job, _gate: Arc<dyn ToolGate>) -> RunFuture<'_> {
        Box::pin(async move {
            self.0 += 1;
            if job.code == "slow" {
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            if job.code == "end" {
                let error = RunError::new(ErrorKind::FuelExhausted, "the fuel ran out");
                return RunResult::builder("counting", Err(error))
                    .session_ended(true)
                    .build();
            }
            RunResult::builder("counting", Ok(self.0.into())).build()
        })
    }
}

impl Backend for Counting {
    fn name(&self) -> &'static str {
        "counting"
    }
    fn provides_isolation(&self) -> bool {
        true
    }
    fn availability(&self) -> Availability {
        Availability::Available
    }
    fn run(&self, _job: Job, _gate: Arc<dyn ToolGate>) -> RunFuture<'_> {
        Box::pin(async { RunResult::builder("counting", Ok(0.into())).build() })
    }
    fn supports_sessions(&self) -> bool {
        true
    }
    fn open_session(&self, _limits: &Limits) -> SessionFuture<'_> {
        Box::pin(async { Ok(Box::new(CountingSession(0)) as Box<dyn BackendSession>) })
    }
}

fn manager(config: SessionConfig) -> Arc<SessionManager> {
    let runner = Runner::builder()
        .backend(Arc::new(Counting))
        .build()
        .unwrap();
    Arc::new(SessionManager::new(runner, config).unwrap())
}

fn config(max: usize, idle: u64, life: u64) -> SessionConfig {
    SessionConfig {
        max_sessions: max,
        idle_timeout: Duration::from_secs(idle),
        max_lifetime: Duration::from_secs(life),
    }
}

fn kind(result: &RunResult) -> Option<ErrorKind> {
    result.error.as_ref().map(|e| e.kind)
}

#[tokio::test(start_paused = true)]
async fn ids_are_distinct_and_sessions_keep_their_own_state() {
    let m = manager(SessionConfig::default());
    let a = m.create().await.unwrap();
    let b = m.create().await.unwrap();
    assert_ne!(a, b);
    assert_eq!(a.as_str().len(), 32);
    assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
    assert!(
        !format!("{a:?}").contains(a.as_str()),
        "Debug shows only a prefix"
    );
    for expected in 1..=3 {
        assert_eq!(m.run(&a, RunRequest::new("x")).await.value, expected);
    }
    assert_eq!(m.run(&b, RunRequest::new("x")).await.value, 1);
}

#[tokio::test(start_paused = true)]
async fn the_cap_refuses_a_session_past_it_until_one_closes() {
    let m = manager(config(2, 600, 3600));
    let a = m.create().await.unwrap();
    m.create().await.unwrap();
    let refused = m.create().await.unwrap_err();
    assert_eq!(refused.kind, ErrorKind::TooManySessions);
    assert!(m.close(&a));
    assert!(!m.close(&a));
    m.create().await.unwrap();
    assert_eq!(m.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_idle_session_expires_and_its_id_is_not_found() {
    let m = manager(config(4, 60, 3600));
    let a = m.create().await.unwrap();
    let b = m.create().await.unwrap();
    tokio::time::advance(Duration::from_secs(40)).await;
    assert!(
        m.run(&b, RunRequest::new("x")).await.ok,
        "use keeps b alive"
    );
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_eq!(m.sweep(), 1);
    let gone = m.run(&a, RunRequest::new("x")).await;
    assert_eq!(kind(&gone), Some(ErrorKind::SessionNotFound));
    assert!(m.get(&b).is_some());
    assert_eq!(
        kind(&m.run(&"nope".into(), RunRequest::new("x")).await),
        Some(ErrorKind::SessionNotFound)
    );
}

#[tokio::test(start_paused = true)]
async fn a_session_past_its_lifetime_expires_even_when_used() {
    let m = manager(config(4, 60, 100));
    let a = m.create().await.unwrap();
    for _ in 0..4 {
        tokio::time::advance(Duration::from_secs(30)).await;
        m.run(&a, RunRequest::new("x")).await;
    }
    assert!(m.get(&a).is_none());
}

#[tokio::test(start_paused = true)]
async fn the_sweeper_destroys_expired_sessions_on_its_own() {
    let m = manager(config(4, 60, 3600));
    m.create().await.unwrap();
    let sweeper = m.spawn_sweeper(Duration::from_secs(10));
    tokio::time::sleep(Duration::from_secs(75)).await;
    assert!(m.is_empty());
    drop(m);
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(sweeper.is_finished(), "the sweeper stops with its manager");
}

#[tokio::test(start_paused = true)]
async fn a_second_run_while_one_is_running_is_refused_as_busy() {
    let m = manager(SessionConfig::default());
    let a = m.create().await.unwrap();
    let session = m.get(&a).unwrap();
    let slow = tokio::spawn({
        let session = session.clone();
        async move { session.run("slow").await }
    });
    tokio::task::yield_now().await;
    assert!(session.is_busy());
    let busy = session.run("x").await;
    assert_eq!(kind(&busy), Some(ErrorKind::SessionBusy));
    assert_eq!(slow.await.unwrap().value, 1);
    assert_eq!(
        session.run("x").await.value,
        2,
        "the refused run never reached the guest"
    );
}

#[tokio::test(start_paused = true)]
async fn a_busy_session_is_not_idle() {
    let m = manager(config(4, 30, 3600));
    let a = m.create().await.unwrap();
    let slow = tokio::spawn({
        let (m, a) = (m.clone(), a.clone());
        async move { m.run(&a, RunRequest::new("slow")).await }
    });
    tokio::time::sleep(Duration::from_secs(45)).await;
    assert_eq!(m.sweep(), 0);
    slow.await.unwrap();
    assert!(m.get(&a).is_some(), "the run's end counts as use");
}

#[tokio::test(start_paused = true)]
async fn a_run_that_ends_the_session_says_so_and_later_runs_say_why() {
    let m = manager(SessionConfig::default());
    let a = m.create().await.unwrap();
    m.run(&a, RunRequest::new("x")).await;
    let ending = m.run(&a, RunRequest::new("end")).await;
    assert!(ending.session_ended);
    assert_eq!(kind(&ending), Some(ErrorKind::FuelExhausted));
    let later = m.run(&a, RunRequest::new("x")).await;
    assert_eq!(kind(&later), Some(ErrorKind::SessionEnded));
    let message = &later.error.unwrap().message;
    assert!(
        message.contains("run 2 ended it") && message.contains("fuel_exhausted"),
        "{message}"
    );
}

#[test]
fn a_zero_setting_is_refused_by_name() {
    let runner = Runner::builder()
        .backend(Arc::new(Counting))
        .build()
        .unwrap();
    let err = SessionManager::new(runner, config(0, 1, 1)).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput);
    assert!(err.message.contains("max_sessions"));
    let parsed: SessionConfig = serde_json::from_str(r#"{"idle_timeout": 5}"#).unwrap();
    assert_eq!(parsed.idle_timeout, Duration::from_secs(5));
    assert_eq!(parsed.max_sessions, 16);
}
