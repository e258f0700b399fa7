//! The one way rota builds an HTTP client: with the `ring` TLS crypto
//! provider installed first.
//!
//! reqwest and sqlx both use rustls, whose crypto comes from a provider
//! chosen at build time. Their default features pick `aws-lc-rs`, whose C
//! and assembly build (aws-lc-sys, with CMake) was the longest part of a
//! cold release build; the workspace asks for `ring` instead
//! (`rustls-no-provider` for reqwest, `tls-rustls-ring-webpki` for sqlx).
//! sqlx passes its provider explicitly, but reqwest without a provider
//! feature takes the process-wide default and panics when there is none,
//! so every reqwest client is built through [`http_client`] (clippy's
//! `disallowed-methods` refuses the others), and code that lets a library
//! build one (the OTLP exporter) calls [`install_crypto_provider`] first.
//!
//! Deliberately left out: any TLS setting of our own. Certificates are
//! checked against the platform's roots, as reqwest does by default.

use std::sync::Once;

/// Installs rustls' `ring` provider as the process-wide default, once. A
/// provider installed before (by an application embedding rota) is kept:
/// any provider serves reqwest.
pub fn install_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // An error means a provider is installed already, which is all we need.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A reqwest client builder, after [`install_crypto_provider`]. Use it
/// instead of `reqwest::Client::builder()`, `Client::new()` or
/// `reqwest::get()`, which panic on the first TLS set-up without a provider.
#[allow(clippy::disallowed_methods)]
pub fn http_client() -> reqwest::ClientBuilder {
    install_crypto_provider();
    reqwest::Client::builder()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_builds_and_the_ring_provider_is_the_default() {
        http_client().build().unwrap();
        let provider = rustls::crypto::CryptoProvider::get_default().expect("a default provider");
        let ring = rustls::crypto::ring::default_provider();
        let names = |p: &rustls::crypto::CryptoProvider| p.cipher_suites.iter().map(|s| s.suite()).collect::<Vec<_>>();
        assert_eq!(names(provider), names(&ring));
    }
}
