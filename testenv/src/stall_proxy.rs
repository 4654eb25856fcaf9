//! A TCP proxy whose forwarding a test can stall: connections stay open but no byte moves either way, as
//! when a network path hangs (the process on the other side runs on, unlike one stopped with SIGSTOP).
//! In front of an apiserver ([`StallProxy`], with a kubeconfig for it) or any TCP service
//! ([`StallLink`]: a NATS leaf node's link to its hub).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::apiserver::ApiServer;
use crate::error::{io_error, TestEnvError};
use crate::kubeconfig;

/// A running proxy in front of an apiserver; stops accepting and forwarding when dropped.
#[derive(Debug)]
pub struct StallProxy {
    link: StallLink,
    kubeconfig: PathBuf,
}

impl StallProxy {
    /// A kubeconfig like the apiserver's, pointing at the proxy.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// From now on no byte is forwarded in either direction (what is read is held).
    pub fn stall(&self) {
        self.link.stall();
    }

    /// Forwarding goes on, held bytes first.
    pub fn resume(&self) {
        self.link.resume();
    }
}

/// A running TCP proxy on a loopback port; stops accepting and forwarding when dropped.
#[derive(Debug)]
pub struct StallLink {
    stalled: watch::Sender<bool>,
    port: u16,
    acceptor: JoinHandle<()>,
}

impl StallLink {
    /// Starts a proxy to `upstream` (`host:port`) on a free loopback port. Its tasks run on the calling
    /// runtime.
    pub async fn start(upstream: String, name: &str) -> Result<Self, TestEnvError> {
        let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .await
            .map_err(io_error("bind proxy", Path::new(name)))?;
        let port = listener
            .local_addr()
            .map_err(io_error("bind proxy", Path::new(name)))?
            .port();
        let (stalled, watching) = watch::channel(false);
        let acceptor = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(pipe(client_read, server_write, watching.clone()));
                tokio::spawn(pipe(server_read, client_write, watching.clone()));
            }
        });
        Ok(Self {
            stalled,
            port,
            acceptor,
        })
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// From now on no byte is forwarded in either direction (what is read is held).
    pub fn stall(&self) {
        self.stalled.send_replace(true);
    }

    /// Forwarding goes on, held bytes first.
    pub fn resume(&self) {
        self.stalled.send_replace(false);
    }
}

impl Drop for StallLink {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

/// Waits while the proxy is stalled.
async fn flowing(stalled: &mut watch::Receiver<bool>) {
    let _ = stalled.wait_for(|stalled| !stalled).await;
}

async fn pipe(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut stalled: watch::Receiver<bool>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        flowing(&mut stalled).await;
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        flowing(&mut stalled).await;
        if to.write_all(&buffer[..read]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

impl ApiServer {
    /// Starts a proxy on a free loopback port that forwards to this apiserver, and writes a kubeconfig for
    /// it next to the server's own. Its tasks run on the calling runtime.
    pub async fn stall_proxy(&self, name: &str) -> Result<StallProxy, TestEnvError> {
        let link = StallLink::start(self.url().replace("https://", ""), name).await?;
        let dir = self.kubeconfig_path().parent().unwrap_or(Path::new("."));
        let kubeconfig = dir.join(format!("kubeconfig-{name}"));
        kubeconfig::with_server(
            self.kubeconfig_path(),
            &kubeconfig,
            &format!("https://127.0.0.1:{}", link.port()),
        )?;
        Ok(StallProxy { link, kubeconfig })
    }
}
