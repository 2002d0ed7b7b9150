//! Attacks on a listener by a slow client, over a raw socket: what reqwest cannot do. Shared
//! with the adversarial suite's `servers` category.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Sends `head` (a request line and headers promising a 1,000-byte body), then one body byte
/// every 100 ms for up to 30 s; how long the server let it go on, and what it answered.
pub async fn trickle(addr: &str, head: &str) -> (Duration, String) {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    while started.elapsed() < Duration::from_secs(30) {
        tokio::select! {
            read = stream.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            },
            () = tokio::time::sleep(Duration::from_millis(100)) => {
                if stream.write_all(b" ").await.is_err() {
                    break;
                }
            }
        }
    }
    (
        started.elapsed(),
        String::from_utf8_lossy(&answer).into_owned(),
    )
}

/// Sends half a request line, then nothing; how long until the server closed it.
pub async fn stall_headers(addr: &str) -> Duration {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(b"POST /mcp HT").await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer)).await;
    started.elapsed()
}
