//! TCP_NODELAY on the store's connections, as libpq sets it on every one.
//!
//! sqlx opens its TCP sockets with Nagle's algorithm on and has no option
//! to turn it off. Over TLS a round trip leaves as several small writes,
//! and Nagle holds back each one after the first until the server
//! acknowledges the first, which the server delays: on loopback, with
//! `sslmode=require`, that cost three quarters of the workflow benchmark's
//! throughput (340 workflows/s against 1,300 without TLS; 1,210 with this).
//!
//! So each time a pool opens a connection, this sets the option on every
//! socket of the process connected to the database's port. The new
//! connection is among them; the option is harmless on the others (it
//! only sends small writes sooner). On Linux the sockets are found through
//! `/proc/self/fd`; elsewhere this does nothing.

use std::mem::{MaybeUninit, size_of};

/// Sets TCP_NODELAY on every TCP socket of this process whose peer's port
/// is `port`; returns how many it found.
pub(crate) fn set_on_sockets_to(port: u16) -> usize {
    sockets_to(port).into_iter().filter(|fd| set_nodelay(*fd)).count()
}

/// The file descriptors of this process that are TCP sockets connected to `port`.
fn sockets_to(port: u16) -> Vec<libc::c_int> {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else { return Vec::new() };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<libc::c_int>().ok())
        .filter(|fd| peer_port(*fd) == Some(port))
        .collect()
}

/// The peer port of `fd` when it is a connected TCP socket.
fn peer_port(fd: libc::c_int) -> Option<u16> {
    let mut address = MaybeUninit::<libc::sockaddr_storage>::zeroed();
    let mut length = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: the buffer and its length describe writable memory we own;
    // an fd that is not a connected socket (or was closed meanwhile) makes
    // the call fail, and nothing is read then.
    let rc = unsafe { libc::getpeername(fd, address.as_mut_ptr().cast(), &mut length) };
    if rc != 0 {
        return None;
    }
    // SAFETY: getpeername succeeded, so it wrote a socket address of the family it names.
    let address = unsafe { address.assume_init() };
    let big_endian_port = match i32::from(address.ss_family) {
        // SAFETY: the family says which struct the storage holds.
        libc::AF_INET => unsafe { (*(&raw const address).cast::<libc::sockaddr_in>()).sin_port },
        // SAFETY: as above.
        libc::AF_INET6 => unsafe { (*(&raw const address).cast::<libc::sockaddr_in6>()).sin6_port },
        _ => return None,
    };
    Some(u16::from_be(big_endian_port))
}

/// Whether `fd` has TCP_NODELAY set.
#[cfg(test)]
fn is_set(fd: libc::c_int) -> bool {
    let mut value: libc::c_int = 0;
    let mut length = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the buffer and its length describe writable memory we own.
    let rc = unsafe { libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, (&raw mut value).cast(), &mut length) };
    rc == 0 && value != 0
}

fn set_nodelay(fd: libc::c_int) -> bool {
    let on: libc::c_int = 1;
    // SAFETY: the value and its length describe memory we own; a socket
    // closed and reused meanwhile gets an option that is harmless on any
    // TCP socket, or refuses it.
    let rc = unsafe {
        libc::setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, (&raw const on).cast(), size_of::<libc::c_int>() as libc::socklen_t)
    };
    rc == 0
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use rota_model::{QueueName, SystemClock};
    use rota_store::{Outgoing, Queues};

    use super::*;

    /// How long a connection may take to finish its handshake.
    const WAIT_MAX: Duration = Duration::from_secs(10);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_connection_of_the_store_has_nagle_off() {
        let Some(schema) = rota_testkit::postgres::TestSchema::new("TCP_NODELAY on PostgreSQL") else { return };
        let mut config = crate::Config::new(schema.url.clone());
        config.schema = schema.name.clone();
        config.connections_max = 4;
        let port = config.connect_options().unwrap().get_port();
        let store = Arc::new(crate::PgStore::open(config, Arc::new(SystemClock)).await.unwrap());
        // Sends at once, so that the pool opens several connections.
        let queue = QueueName::new("work").unwrap();
        let sends = (0..16).map(|n| {
            let (store, queue) = (store.clone(), queue.clone());
            tokio::spawn(async move { store.send(&queue, Outgoing::json(&serde_json::json!(n)).unwrap()).await.unwrap() })
        });
        for send in sends.collect::<Vec<_>>() {
            send.await.unwrap();
        }
        // A connection still in its handshake has no option yet: it gets
        // it once the pool has the connection.
        let started = Instant::now();
        loop {
            let sockets = sockets_to(port);
            let nagle_on: Vec<_> = sockets.iter().filter(|fd| !is_set(**fd)).collect();
            assert!(sockets.len() >= 2, "expected the store's connections among this process's sockets to port {port}, found {sockets:?}");
            if nagle_on.is_empty() {
                break;
            }
            assert!(started.elapsed() < WAIT_MAX, "sockets {nagle_on:?} to the database (port {port}) have Nagle's algorithm on");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
