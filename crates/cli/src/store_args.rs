//! Where a command acts, as the global flags `--store`, `--durability`,
//! `--server` and `--token` say: every command gets a [`StoreArgs`] and
//! opens what it needs only after checking its own arguments.

use rota_store::SharedStore;

use crate::backend::Backend;
use crate::remote::{self, Server};
use crate::store_url::{self, DurabilityArg, open_store};

/// Where the store is, as the global flags say, or the server whose API
/// the operator commands use instead. Commands open it only after checking
/// their own arguments, so a bad argument is reported first.
pub struct StoreArgs {
    /// `--store`: the store URL.
    pub url: String,
    /// `--durability`: what a SQLite commit survives.
    pub durability: DurabilityArg,
    /// `--server` and `--token`, when the operator commands go over HTTP.
    pub server: Option<remote::ServerArgs>,
}

impl StoreArgs {
    /// Opens the store, running its migrations.
    pub async fn open(&self) -> anyhow::Result<SharedStore> {
        open_store(&self.url, self.durability.into()).await
    }

    /// Where an operator command acts: the remote server when `--server`
    /// names one, else the store (opened here). A SQLite store must exist
    /// already: an operator command that looks at a mistyped path should say
    /// so, not create an empty store there and report nothing in it.
    pub async fn backend(&self) -> anyhow::Result<Backend> {
        match &self.server {
            Some(server) => Ok(Backend::Remote(Server::new(server)?)),
            None => {
                // (A missing directory is reported by `open`, naming it.)
                if let store_url::StoreUrl::Sqlite(path) = store_url::StoreUrl::parse(&self.url)?
                    && !path.exists()
                    && path.parent().is_none_or(|parent| parent.as_os_str().is_empty() || parent.is_dir())
                {
                    anyhow::bail!(
                        "cannot open store {}: {} does not exist (`rota serve` or `rota migrate` creates a store; check --store or ROTA_STORE)",
                        self.url,
                        path.display()
                    );
                }
                Ok(Backend::Local(self.open().await?))
            }
        }
    }

    /// Fails for a command that works only on a local store when `--server`
    /// (or ROTA_SERVER) names a server.
    pub fn local_only(&self, command: &str) -> anyhow::Result<()> {
        match &self.server {
            Some(server) => anyhow::bail!(
                "`rota {command}` works only on a local store (--store), not over HTTP; --server {} is set (unset ROTA_SERVER if it came from there)",
                server.url
            ),
            None => Ok(()),
        }
    }
}
