//! The launch request, its `replica_config` schema, and every validation rule, as pure
//! functions: a request is checked completely before any actor exists, so a bad request leaves
//! nothing to roll back.
//!
//! Two stages:
//! 1. [`validate()`] checks the request alone (structure, global conflicts, topology, engine
//!    options) and gives a [`LaunchSpec`].
//! 2. [`place`] checks the spec against the cluster as it is (workers, visible and occupied
//!    GPUs, replica uids of other models) and gives one [`Placement`] per replica.
//!
//! The parts, each depending only on those listed before it:
//! - `request`: the request as clients send it, with strict types;
//! - `keywords`: the launch keywords, taken out of the engine keywords;
//! - `spec`: what validation gives placement;
//! - `validate`: the rules on the request alone;
//! - `gpu`: whether a replica may join the replicas already on a GPU;
//! - `placement`: the rules on the cluster's state, and where each replica goes;
//! - `scale`: more replicas of a running model, as a spec placement takes like a launch's.
//!
//! The message texts are those of the reference implementation (Xinference), so users who
//! know it recognise them.

use crate::error::{ActorError, LaunchRule};

mod gpu;
mod keywords;
mod placement;
mod request;
mod scale;
mod spec;
#[cfg(test)]
mod tests;
mod validate;

pub(crate) use gpu::GpuTenant;
pub use keywords::LAUNCH_KEYWORDS;
pub(crate) use placement::{ClusterView, Placement, WorkerSlot, place};
pub use request::{
    DeviceConfig, GpuCount, GpuIdx, LaunchRequest, ModelSize, RESERVED_ENGINE_CONFIG_KEYS, ReplicaConfig,
    Role,
};
pub use scale::{MAX_SCALE, ScaleRequest, refused_key as scale_refused_key};
pub(crate) use scale::{one_replica, scale_spec};
pub(crate) use spec::LaunchSpec;
pub(crate) use validate::validate;

/// The refusal of a launch for breaking `rule`.
fn invalid(rule: LaunchRule, message: impl Into<String>) -> ActorError {
    ActorError::launch(rule, message)
}
