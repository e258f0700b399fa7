//! A fault-injecting TCP proxy for tests and `rota demo --chaos`: put it between rota and its
//! database and switch it, at any moment, between passing bytes, stalling
//! every connection (bytes are held, connections stay open: a database
//! that hangs) and cutting them (open connections are closed, new ones are
//! closed at once: a database that is gone).

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does to the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Bytes flow both ways.
    Pass,
    /// Nothing flows; connections stay open and new ones are accepted and
    /// held, as with a database host that stopped answering.
    Stall,
    /// Open connections are closed and new ones closed as they come, as
    /// with a database that is down.
    Cut,
}

/// A running proxy, stopped when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    accepting: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `upstream`, passing
    /// bytes until told otherwise. Needs a Tokio runtime.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (mode, watching) = watch::channel(Mode::Pass);
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let mode = watching.clone();
                if *mode.borrow() == Mode::Cut {
                    continue; // dropped: closed at once
                }
                tokio::spawn(forward(client, upstream, mode));
            }
        });
        Ok(FaultProxy { addr, mode, accepting })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches what the proxy does, for every connection at once.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.set(Mode::Cut);
        self.accepting.abort();
    }
}

/// One client's connection: opened upstream, then pumped both ways until
/// either side closes or the proxy cuts it.
async fn forward(client: TcpStream, upstream: SocketAddr, mode: watch::Receiver<Mode>) {
    let Ok(server) = TcpStream::connect(upstream).await else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        _ = pump(client_read, server_write, mode.clone()) => {}
        _ = pump(server_read, client_write, mode) => {}
    }
}

/// Copies `from` to `to` while the mode passes; holds the bytes while it
/// stalls; returns (closing both) when it cuts or either side closes.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut mode: watch::Receiver<Mode>) {
    let mut buffer = vec![0_u8; 16 * 1024];
    loop {
        let current = *mode.borrow_and_update();
        match current {
            Mode::Cut => return,
            Mode::Stall => {
                if mode.changed().await.is_err() {
                    return;
                }
            }
            Mode::Pass => {
                tokio::select! {
                    read = from.read(&mut buffer) => match read {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            // A switch to Stall while these bytes are in hand
                            // holds them until the mode changes again.
                            loop {
                                let now = *mode.borrow_and_update();
                                match now {
                                    Mode::Cut => return,
                                    Mode::Pass => break,
                                    Mode::Stall => {
                                        if mode.changed().await.is_err() {
                                            return;
                                        }
                                    }
                                }
                            }
                            if to.write_all(&buffer[..n]).await.is_err() {
                                return;
                            }
                        }
                    },
                    changed = mode.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// An echo server on a free port.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buffer = [0_u8; 1024];
                    while let Ok(n) = stream.read(&mut buffer).await {
                        if n == 0 || stream.write_all(&buffer[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream, text: &[u8]) -> Vec<u8> {
        stream.write_all(text).await.unwrap();
        let mut got = vec![0_u8; text.len()];
        stream.read_exact(&mut got).await.unwrap();
        got
    }

    #[tokio::test]
    async fn passes_then_stalls_then_passes_the_held_bytes_then_cuts() {
        let proxy = FaultProxy::start(echo().await).await.unwrap();
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut stream, b"one").await, b"one");

        proxy.set(Mode::Stall);
        stream.write_all(b"two").await.unwrap();
        let mut got = [0_u8; 3];
        let held = tokio::time::timeout(Duration::from_millis(200), stream.read_exact(&mut got)).await;
        assert!(held.is_err(), "nothing flows while stalled");
        proxy.set(Mode::Pass);
        stream.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"two", "the held bytes flow once it passes again");

        proxy.set(Mode::Cut);
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "a cut closes open connections: {closed:?}");
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        let refused = tokio::time::timeout(Duration::from_secs(5), fresh.read_to_end(&mut rest)).await;
        assert!(matches!(refused, Ok(Ok(0)) | Ok(Err(_))), "and new ones at once: {refused:?}");

        proxy.set(Mode::Pass);
        let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut again, b"three").await, b"three");
    }
}
