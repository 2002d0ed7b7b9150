//! Reading and writing length-prefixed frames on a stream.
// Off Unix only the server's half is used (no worker reads responses there).
#![cfg_attr(not(unix), allow(dead_code))]

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::protocol::{self, FRAME_HEADER_BYTES, ProtocolError};

/// Why no frame could be read.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The peer closed the stream between frames.
    Closed,
    /// The peer closed the stream inside a frame.
    Truncated,
    /// The length prefix is over the cap; the body was not read.
    TooLarge(ProtocolError),
    /// The stream failed.
    Io,
}

/// Reads one frame's body. The length is checked against `cap` before any of the body is
/// read, and the buffer grows with the bytes that actually arrive, so a peer that announces a
/// large frame and sends nothing costs nothing.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    cap: u64,
) -> Result<Vec<u8>, ReadError> {
    let header = read_header(reader).await?;
    let len = protocol::check_frame_len(header, cap).map_err(ReadError::TooLarge)?;
    read_body(reader, len).await
}

/// Reads a frame's length prefix.
///
/// # Errors
///
/// [`ReadError::Closed`] when the stream ends before the first byte, `Truncated` inside the
/// prefix, `Io` when it fails.
pub(crate) async fn read_header<R: AsyncRead + Unpin>(
    reader: &mut R,
) -> Result<[u8; FRAME_HEADER_BYTES], ReadError> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    let mut got = 0;
    while got < FRAME_HEADER_BYTES {
        match reader.read(&mut header[got..]).await {
            Ok(0) if got == 0 => return Err(ReadError::Closed),
            Ok(0) => return Err(ReadError::Truncated),
            Ok(n) => got += n,
            Err(_) => return Err(ReadError::Io),
        }
    }
    Ok(header)
}

/// Reads a body of exactly `len` bytes (a length already checked against the cap).
///
/// Hand-written rather than tokio-util's `LengthDelimitedCodec`, measured: after a header
/// announcing 8 MiB and 10 bytes of body, the codec's read buffer held 8,388,608 bytes of
/// capacity, because it reserves the announced length when the header arrives. Here the
/// buffer grows with the bytes that arrive, and the server takes its byte budget between the
/// header and the body, so a peer that announces frames it never sends costs no memory.
/// (The codec's over-cap error also does not say the frame's length.)
pub(crate) async fn read_body<R: AsyncRead + Unpin>(
    reader: &mut R,
    len: usize,
) -> Result<Vec<u8>, ReadError> {
    let mut body = Vec::new();
    let mut limited = reader.take(len as u64);
    match limited.read_to_end(&mut body).await {
        Ok(n) if n == len => Ok(body),
        Ok(_) => Err(ReadError::Truncated),
        Err(_) => Err(ReadError::Io),
    }
}

/// Writes one frame (length prefix and body) and flushes.
pub(crate) async fn write_frame<W: AsyncWrite + Unpin>(
    writer: &mut W,
    body: &[u8],
) -> std::io::Result<()> {
    writer.write_all(&protocol::frame(body)).await?;
    writer.flush().await
}
