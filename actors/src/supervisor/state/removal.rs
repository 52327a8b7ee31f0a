//! Removing one replica from a serving model (a scale-down): it leaves the rotation and
//! finishes its requests, then its worker stops it and it leaves the model. It is not
//! replaced meanwhile, and the model keeps at least one alive replica of each role it needs.

use super::{SupervisorState, settle};
use crate::error::ActorError;
use crate::view::ReplicaStatus;

/// What removing a replica takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Removal {
    /// It serves on `worker_id`: drain it, stop it there, then [`SupervisorState::finish_remove`].
    Drain { worker_id: String },
    /// It was lost and nothing replaces it: it is gone from the model already.
    Forgotten,
}

impl SupervisorState {
    /// Starts removing replica `replica_uid` of model `uid`: an alive one drains (and is not
    /// replaced while it does), a lost one is forgotten at once. Refused for the model's last
    /// alive replica of its role, one that loads, one being replaced, and one already going.
    pub(crate) fn begin_remove(&mut self, uid: &str, replica_uid: &str) -> Result<Removal, ActorError> {
        let model = self.models.get(uid).ok_or_else(|| ActorError::ModelNotFound(uid.to_owned()))?;
        if !model.status.launched() {
            return Err(ActorError::NotReady { model_uid: uid.to_owned(), status: model.status.to_string() });
        }
        let not_found =
            || ActorError::ReplicaNotFound { model_uid: uid.to_owned(), replica_uid: replica_uid.to_owned() };
        let r = model.replicas.iter().find(|r| r.replica_uid == replica_uid).ok_or_else(not_found)?;
        let refuse = |reason: &str| ActorError::ReplicaNotRemovable {
            replica_uid: replica_uid.to_owned(),
            reason: reason.to_owned(),
        };
        if self.removing.contains(replica_uid) {
            return Err(refuse("it is being removed already"));
        }
        let (role, worker_id) = (r.role, r.worker_id.clone());
        let others = |alive_only: bool| {
            model.replicas.iter().any(|o| {
                o.role == role
                    && o.replica_uid != replica_uid
                    && (!alive_only || o.status == ReplicaStatus::Alive)
            })
        };
        let last = |what: &str| {
            refuse(&format!(
                "it is the model's last {what}{} replica; terminate the model instead",
                role.as_str()
            ))
        };
        match r.status {
            ReplicaStatus::Loading => return Err(refuse("it is loading; remove it once it serves")),
            ReplicaStatus::Draining => {
                return Err(refuse("its worker is stopping, and it leaves the model with it"));
            }
            ReplicaStatus::Dead if self.replacing.contains_key(replica_uid) => {
                return Err(refuse("its replacement is loading; remove that one once it serves"));
            }
            ReplicaStatus::Dead if !others(false) => return Err(last("")),
            ReplicaStatus::Dead => {
                self.forget_replica(uid, replica_uid);
                return Ok(Removal::Forgotten);
            }
            ReplicaStatus::Alive if !others(true) => return Err(last("alive ")),
            ReplicaStatus::Alive => {}
        }
        self.removing.insert(replica_uid.to_owned());
        if let Some(model) = self.models.get_mut(uid) {
            if let Some(r) = model.replicas.iter_mut().find(|r| r.replica_uid == replica_uid) {
                r.status = ReplicaStatus::Draining;
            }
            settle(model);
        }
        Ok(Removal::Drain { worker_id })
    }

    /// A removal ended (its replica stopped, or its model or worker went first): the replica
    /// leaves the model, and a worker that still reports it is told to stop it.
    pub(crate) fn finish_remove(&mut self, uid: &str, replica_uid: &str) {
        if self.removing.remove(replica_uid) {
            self.forget_replica(uid, replica_uid);
        }
    }

    /// Whether replica `replica_uid` is being removed (and so is not to be replaced).
    pub(super) fn is_removing(&self, replica_uid: &str) -> bool {
        self.removing.contains(replica_uid)
    }

    fn forget_replica(&mut self, uid: &str, replica_uid: &str) {
        if let Some(model) = self.models.get_mut(uid) {
            model.replicas.retain(|r| r.replica_uid != replica_uid);
            settle(model);
        }
        self.placed_from.remove(replica_uid);
        self.ended.add(replica_uid.to_owned());
    }
}
