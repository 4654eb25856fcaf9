//! Loopback ports and the plain-HTTP GET used to probe servers (etcd, the registry, managers, Prometheus).

use std::net::{Ipv4Addr, SocketAddr, TcpListener};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A port nothing listens on right now. Another process may take it before the server binds it; starts
/// are retried on a new port when the server then fails to bind.
pub(crate) fn free_port() -> std::io::Result<u16> {
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
    Ok(listener.local_addr()?.port())
}

/// `GET path` over plain HTTP/1.0 on loopback; returns the status code and body.
pub async fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    let mut stream = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port))
        .await
        .map_err(|error| format!("connect 127.0.0.1:{port}: {error}"))?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|error| format!("send to 127.0.0.1:{port}: {error}"))?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .await
        .map_err(|error| format!("read from 127.0.0.1:{port}: {error}"))?;
    let text = String::from_utf8_lossy(&response);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("malformed HTTP response from 127.0.0.1:{port}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}
