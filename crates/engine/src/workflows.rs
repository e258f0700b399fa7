//! The workflow definitions the engine runs, by name and version, loaded
//! from the store's registry and kept: versions are immutable, so a cached
//! definition never goes stale.
//!
//! Which version is the latest does change, when a new one is registered.
//! A submission without a version runs the latest, and looking it up costs
//! a read of the registry, which at hundreds of submissions a second is a
//! statement per task for an answer that changes once a deployment. So the
//! latest of each name is kept for [`LATEST_REFRESH_DEFAULT`] (one second,
//! [`Workflows::latest_refresh`]) after it was read; a registration through
//! this cache (or any clone of it) is the latest at once. A version another
//! process registers is what this one submits within that time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rota_model::{Clock, SystemClock, Timestamp, WorkflowName};
use rota_store::{Error as StoreError, SharedStore};
use rota_workflow::Workflow;

use crate::{Error, Result};

/// The most definitions kept in memory; beyond it the cache starts over
/// (definitions are re-read from the store on demand).
const CACHED_MAX: usize = 1_024;

/// How long the latest version of a workflow read from the store is taken
/// as the latest before it is read again.
pub const LATEST_REFRESH_DEFAULT: Duration = Duration::from_secs(1);

/// Definitions by name and version.
type Cache = HashMap<(WorkflowName, u32), Arc<Workflow>>;

/// The latest definition of a name, and when the store said so.
struct Latest {
    workflow: Arc<Workflow>,
    read_at: Timestamp,
}

/// A read-through cache of workflow definitions. Clones share it.
#[derive(Clone)]
pub struct Workflows {
    store: SharedStore,
    clock: Arc<dyn Clock>,
    latest_refresh: Duration,
    cache: Arc<Mutex<Cache>>,
    latest: Arc<Mutex<HashMap<WorkflowName, Latest>>>,
}

impl Workflows {
    /// A cache over `store`'s registry, on the system clock.
    pub fn new(store: SharedStore) -> Self {
        Workflows {
            store,
            clock: Arc::new(SystemClock),
            latest_refresh: LATEST_REFRESH_DEFAULT,
            cache: Arc::new(Mutex::new(HashMap::new())),
            latest: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The clock that ages the latest versions.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// How long a latest version read from the store is used before it is
    /// read again; zero reads it at every lookup.
    pub fn latest_refresh(mut self, refresh: Duration) -> Self {
        self.latest_refresh = refresh;
        self
    }

    /// Registers a definition in the store (idempotent for an identical
    /// definition; a changed definition needs a new version). From then on
    /// it is the latest this cache knows, unless it knows a later one.
    pub async fn register(&self, workflow: &Workflow) -> Result<()> {
        let definition = serde_json::to_value(workflow).map_err(|e| Error::Workflow(format!("serializing {}: {e}", workflow.name())))?;
        self.store.register_workflow(workflow.name(), workflow.version(), &definition).await?;
        self.registered(Arc::new(workflow.clone()));
        Ok(())
    }

    /// Notes a definition registered in the store by other means (the
    /// API's registration), as [`Workflows::register`] does.
    pub fn registered(&self, workflow: Arc<Workflow>) {
        let now = self.clock.now();
        let mut latest = self.lock_latest();
        let newer = latest.get(workflow.name()).is_none_or(|known| known.workflow.version() <= workflow.version());
        if newer {
            latest.insert(workflow.name().clone(), Latest { workflow: workflow.clone(), read_at: now });
        }
        drop(latest);
        self.keep(workflow);
    }

    /// The definition of `name` at `version` (the latest when `None`).
    pub async fn get(&self, name: &WorkflowName, version: Option<u32>) -> Result<Arc<Workflow>> {
        match version {
            Some(version) => {
                if let Some(found) = self.lock_cache().get(&(name.clone(), version)) {
                    return Ok(found.clone());
                }
            }
            None => {
                let now = self.clock.now();
                if let Some(latest) = self.lock_latest().get(name)
                    && now.since(latest.read_at) < self.latest_refresh
                {
                    return Ok(latest.workflow.clone());
                }
            }
        }
        let read_at = self.clock.now();
        let entry = self.store.workflow(name, version).await?.ok_or_else(|| {
            let which = version.map_or_else(|| "any version".to_string(), |v| format!("version {v}"));
            Error::Store(StoreError::NotFound(format!("workflow {name} ({which}) is not registered")))
        })?;
        let workflow: Workflow = serde_json::from_value(entry.definition)
            .map_err(|e| Error::Workflow(format!("stored definition of {name} version {} is unreadable: {e}", entry.version)))?;
        let workflow = Arc::new(workflow);
        if version.is_none() {
            self.lock_latest().insert(name.clone(), Latest { workflow: workflow.clone(), read_at });
        }
        self.keep(workflow.clone());
        Ok(workflow)
    }

    fn keep(&self, workflow: Arc<Workflow>) {
        let mut cache = self.lock_cache();
        if cache.len() >= CACHED_MAX {
            cache.clear();
        }
        cache.insert((workflow.name().clone(), workflow.version()), workflow);
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock_latest(&self) -> std::sync::MutexGuard<'_, HashMap<WorkflowName, Latest>> {
        self.latest.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
