//! A fresh PostgreSQL schema per test, dropped when the test is done.

use std::sync::atomic::{AtomicU32, Ordering};

/// The environment variable that holds the test server's URL.
pub const URL_VARIABLE: &str = "ROTA_TEST_POSTGRES_URL";

/// The test server's URL, or `None` after printing why `test` is skipped.
pub fn url(test: &str) -> Option<String> {
    match std::env::var(URL_VARIABLE) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            println!("SKIP {test}: set {URL_VARIABLE} (for example postgres://postgres@127.0.0.1:5432/test) to run it on PostgreSQL");
            None
        }
    }
}

/// A schema name no other test uses; dropped (with everything in it) on drop.
#[derive(Debug)]
pub struct TestSchema {
    /// The server's URL.
    pub url: String,
    /// The schema's name: lowercase letters, digits and `_`.
    pub name: String,
}

impl TestSchema {
    /// A new schema name for `test`, or `None` (after a `SKIP` line) when no
    /// server is configured. The schema itself is created by whoever opens a
    /// store in it.
    pub fn new(test: &str) -> Option<TestSchema> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let url = url(test)?;
        let unique = uuid::Uuid::new_v4().simple().to_string();
        let name = format!("t_{}_{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed), &unique[..8]);
        Some(TestSchema { url, name })
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let (url, name) = (self.url.clone(), self.name.clone());
        // Drop may run inside a runtime: do the async work on a thread of its own.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(async {
                use sqlx::Connection;
                let mut conn = sqlx::PgConnection::connect(&url).await.ok()?;
                let sql = format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE");
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&mut conn).await.ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(_))) {
            eprintln!("note: could not drop test schema {}", self.name);
        }
    }
}
