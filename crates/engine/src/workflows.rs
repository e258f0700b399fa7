//! The workflow definitions the engine runs, by name and version, loaded
//! from the store's registry and kept: versions are immutable, so a cached
//! definition never goes stale.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rota_model::WorkflowName;
use rota_store::{Error as StoreError, SharedStore};
use rota_workflow::Workflow;

use crate::{Error, Result};

/// The most definitions kept in memory; beyond it the cache starts over
/// (definitions are re-read from the store on demand).
const CACHED_MAX: usize = 1_024;

/// Definitions by name and version.
type Cache = HashMap<(WorkflowName, u32), Arc<Workflow>>;

/// A read-through cache of workflow definitions.
#[derive(Clone)]
pub struct Workflows {
    store: SharedStore,
    cache: Arc<Mutex<Cache>>,
}

impl Workflows {
    /// A cache over `store`'s registry.
    pub fn new(store: SharedStore) -> Self {
        Workflows { store, cache: Arc::new(Mutex::new(HashMap::new())) }
    }

    /// Registers a definition in the store (idempotent for an identical
    /// definition; a changed definition needs a new version).
    pub async fn register(&self, workflow: &Workflow) -> Result<()> {
        let definition = serde_json::to_value(workflow).map_err(|e| Error::Workflow(format!("serializing {}: {e}", workflow.name())))?;
        self.store.register_workflow(workflow.name(), workflow.version(), &definition).await?;
        Ok(())
    }

    /// The definition of `name` at `version` (the latest when `None`).
    pub async fn get(&self, name: &WorkflowName, version: Option<u32>) -> Result<Arc<Workflow>> {
        if let Some(version) = version
            && let Some(found) = self.cache.lock().expect("workflow cache").get(&(name.clone(), version))
        {
            return Ok(found.clone());
        }
        let entry = self.store.workflow(name, version).await?.ok_or_else(|| {
            let which = version.map_or_else(|| "any version".to_string(), |v| format!("version {v}"));
            Error::Store(StoreError::NotFound(format!("workflow {name} ({which}) is not registered")))
        })?;
        let workflow: Workflow = serde_json::from_value(entry.definition)
            .map_err(|e| Error::Workflow(format!("stored definition of {name} version {} is unreadable: {e}", entry.version)))?;
        let workflow = Arc::new(workflow);
        let mut cache = self.cache.lock().expect("workflow cache");
        if cache.len() >= CACHED_MAX {
            cache.clear();
        }
        cache.insert((name.clone(), entry.version), workflow.clone());
        Ok(workflow)
    }
}
