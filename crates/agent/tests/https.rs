//! The `http` agent over TLS: a real HTTPS server on loopback, checked
//! against the platform's roots through rustls with the `ring` provider
//! (the only one the workspace builds).
//!
//! The test's CA reaches the verifier through `SSL_CERT_FILE`, which the
//! platform verifier reads on Linux. Setting the environment is only sound
//! while no other thread runs, so this file holds a single test that sets it
//! before it starts any thread. The certificates in `tests/tls/` were made
//! with openssl (P-256, valid until 2126): `ca.pem` signs `server.pem`,
//! whose only name is the address 127.0.0.1.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use rota_agent::{Agent, HttpAgent, Request};
use rota_model::{Clock, SystemClock};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};

const SERVER_CERT: &[u8] = include_bytes!("tls/server.pem");
const SERVER_KEY: &[u8] = include_bytes!("tls/server.key");

/// What the server read of one request: its head and its body.
struct Received {
    head: String,
    body: Vec<u8>,
}

/// Serves every connection on a thread of its own: a TLS handshake with the
/// test certificate, one request read, one fixed JSON response. Connections
/// whose handshake fails (the client refused the certificate) are dropped.
fn https_server(response: &'static str) -> (u16, mpsc::Receiver<Received>) {
    let certs = vec![CertificateDer::from_pem_slice(SERVER_CERT).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(SERVER_KEY).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let Ok(tcp) = tcp else { continue };
            let (config, tx) = (config.clone(), tx.clone());
            std::thread::spawn(move || {
                if let Some(received) = answer(config, tcp, response) {
                    let _ = tx.send(received);
                }
            });
        }
    });
    (port, rx)
}

/// One request on one connection; `None` when the connection failed
/// (a refused handshake ends here).
fn answer(config: Arc<rustls::ServerConfig>, tcp: TcpStream, response: &str) -> Option<Received> {
    tcp.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut tls = rustls::StreamOwned::new(rustls::ServerConnection::new(config).ok()?, tcp);
    let mut data = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = tls.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&data[..head_end]).into_owned();
    let length = head
        .lines()
        .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap()))
        .unwrap_or(0);
    while data.len() < head_end + length {
        let n = tls.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&chunk[..n]);
    }
    let reply = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{response}",
        response.len()
    );
    tls.write_all(reply.as_bytes()).ok()?;
    tls.conn.send_close_notify();
    tls.flush().ok()?;
    Some(Received { head, body: data[head_end..head_end + length].to_vec() })
}

fn request(input: Value, clock: &dyn Clock) -> Request {
    common::request("charge", 1, input, clock.now() + Duration::from_secs(20))
}

#[test]
fn https_calls_succeed_and_the_certificate_is_checked() {
    let ca = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tls/ca.pem");
    // SAFETY: no other thread exists yet: this is the only test of its
    // binary, and the runtime and the server start below.
    unsafe { std::env::set_var("SSL_CERT_FILE", ca) };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (port, received) = https_server(r#"{"charge_id":"c-1"}"#);
    let clock = Arc::new(SystemClock);
    let agent = HttpAgent::new(clock.clone()).unwrap();

    let input = json!({ "method": "POST", "url": format!("https://127.0.0.1:{port}/charge"), "body": {"amount": 12}, "timeout": "10s" });
    let output = runtime.block_on(agent.call(&request(input, clock.as_ref())));
    assert_eq!(output, Ok(json!({"charge_id": "c-1"})));
    let seen = received.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(seen.head.starts_with("POST /charge HTTP/1.1\r\n"), "{}", seen.head);
    assert!(seen.head.to_ascii_lowercase().contains("idempotency-key: order-17/charge\r\n"), "{}", seen.head);
    assert_eq!(serde_json::from_slice::<Value>(&seen.body).unwrap(), json!({"amount": 12}));

    // The same server under a name its certificate does not carry: the
    // handshake is refused, so the certificate really is checked.
    let input = json!({ "method": "GET", "url": format!("https://localhost:{port}/charge"), "timeout": "10s" });
    let err = runtime.block_on(agent.call(&request(input, clock.as_ref()))).unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(err.message().contains("certificate"), "{err}");
    assert!(received.try_recv().is_err(), "no request may reach a server whose certificate was refused");
}
