//! Which process each worker id belongs to.

use crate::node::Namespace;
use std::collections::HashMap;
use std::sync::Mutex;
use xinf_transfer::sync::lock;

/// The process each registered worker id belongs to (its instance), shared with the tasks:
/// a call to worker `id` goes to that process's own group, never to another process under the
/// same id (a frozen one the supervisor counted lost, which would hold the call).
#[derive(Debug, Default)]
pub(crate) struct WorkerInstances(Mutex<HashMap<String, u64>>);

impl WorkerInstances {
    pub(super) fn set(&self, worker_id: &str, instance: u64) {
        lock(&self.0).insert(worker_id.to_owned(), instance);
    }

    /// The process group that reaches worker `worker_id`: its registered process's, else
    /// the id's.
    pub(crate) fn group(&self, ns: &Namespace, worker_id: &str) -> String {
        match lock(&self.0).get(worker_id) {
            Some(instance) => ns.worker_instance_group(worker_id, *instance),
            None => ns.worker_group(worker_id),
        }
    }
}
