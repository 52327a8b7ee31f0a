//! The block tracker: one per model, on the supervisor node. A thin actor around
//! [`state::BlockTrackerState`]. Prefill replicas publish the pages of their snapshot caches
//! here under content keys, and look up who holds the pages of a new prompt's prefix.

pub(crate) mod state;

use crate::error::ActorError;
use crate::wire::{Wire, answer, call};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use ractor_cluster::RactorClusterMessage;
use state::{BlockLocation, BlockTrackerState};
use std::time::Duration;
use xinf_transfer::transport::Endpoint;

/// What a registration carries: where the blocks are read (when the replica serves them), and
/// their `(hash, block_id)` pairs.
type Registration = (Option<Endpoint>, Vec<(u64, u32)>);

/// Messages of the block tracker; every one may cross nodes (prefill replicas on worker
/// nodes publish their snapshot pages here and look up pages held elsewhere).
#[derive(RactorClusterMessage)]
pub(crate) enum BlockTrackerMsg {
    /// A replica holds these `(hash, block_id)` pairs, readable at the endpoint (when given).
    Register { replica_uid: String, blocks: Wire<Registration> },
    /// A replica freed these blocks.
    Unregister { replica_uid: String, block_ids: Wire<Vec<u32>> },
    /// A replica is gone: forget all it held.
    UnregisterReplica { replica_uid: String },
    /// Who holds these hashes (other than the replica named, if any)?
    #[rpc]
    Query { query: Wire<(Vec<u64>, Option<String>)>, reply: RpcReplyPort<Wire<Vec<BlockLocation>>> },
    /// How many blocks are registered.
    #[rpc]
    Count { reply: RpcReplyPort<Wire<usize>> },
}

/// The block tracker actor.
pub(crate) struct BlockTracker;

impl Actor for BlockTracker {
    type Msg = BlockTrackerMsg;
    type State = BlockTrackerState;
    /// The process group the tracker joins, where replicas on any node find it.
    type Arguments = String;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        group: String,
    ) -> Result<Self::State, ActorProcessingErr> {
        ractor::pg::join(group, vec![myself.get_cell()]);
        Ok(BlockTrackerState::default())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            BlockTrackerMsg::Register { replica_uid, blocks } => match blocks.0 {
                Ok((endpoint, blocks)) => state.register(&replica_uid, endpoint, &blocks),
                Err(e) => tracing::warn!(error = %e, "a block registration did not decode"),
            },
            BlockTrackerMsg::Unregister { replica_uid, block_ids } => match block_ids.0 {
                Ok(ids) => state.unregister(&replica_uid, &ids),
                Err(e) => tracing::warn!(error = %e, "a block unregistration did not decode"),
            },
            BlockTrackerMsg::UnregisterReplica { replica_uid } => {
                let n = state.unregister_replica(&replica_uid);
                tracing::debug!(%replica_uid, blocks = n, "block tracker purged a replica");
            }
            BlockTrackerMsg::Query { query, reply } => {
                let found = query.0.map(|(hashes, exclude)| state.query(&hashes, exclude.as_deref()));
                answer(reply, Wire(found));
            }
            BlockTrackerMsg::Count { reply } => answer(reply, Wire::ok(state.len())),
        }
        Ok(())
    }
}

/// A model's block tracker: which replica holds which KV blocks, by content hash.
#[derive(Clone)]
pub struct BlockTrackerHandle {
    actor: ActorRef<BlockTrackerMsg>,
    timeout: Duration,
}

impl BlockTrackerHandle {
    pub(crate) fn new(actor: ActorRef<BlockTrackerMsg>, timeout: Duration) -> Self {
        Self { actor, timeout }
    }

    fn send(&self, msg: BlockTrackerMsg) -> Result<(), ActorError> {
        self.actor.cast(msg).map_err(|e| ActorError::Unreachable {
            what: "block tracker".into(),
            reason: crate::wire::messaging_reason(&e),
        })
    }

    /// Records that a replica holds these `(hash, block_id)` pairs; a block id registered
    /// again with another hash replaces its old entry.
    pub fn register(&self, replica_uid: &str, blocks: Vec<(u64, u32)>) -> Result<(), ActorError> {
        self.register_at(replica_uid, None, blocks)
    }

    /// Like [`register`](Self::register), with where the blocks can be read.
    pub fn register_at(
        &self,
        replica_uid: &str,
        endpoint: Option<Endpoint>,
        blocks: Vec<(u64, u32)>,
    ) -> Result<(), ActorError> {
        let blocks = Wire::ok((endpoint, blocks));
        self.send(BlockTrackerMsg::Register { replica_uid: replica_uid.to_owned(), blocks })
    }

    /// Forgets some blocks of a replica.
    pub fn unregister(&self, replica_uid: &str, block_ids: Vec<u32>) -> Result<(), ActorError> {
        let block_ids = Wire::ok(block_ids);
        self.send(BlockTrackerMsg::Unregister { replica_uid: replica_uid.to_owned(), block_ids })
    }

    /// Forgets everything a replica holds.
    pub fn unregister_replica(&self, replica_uid: &str) -> Result<(), ActorError> {
        self.send(BlockTrackerMsg::UnregisterReplica { replica_uid: replica_uid.to_owned() })
    }

    /// For each hash, a replica (other than `exclude`) that holds it; unknown hashes are left out.
    pub async fn query(
        &self,
        hashes: Vec<u64>,
        exclude: Option<&str>,
    ) -> Result<Vec<BlockLocation>, ActorError> {
        let query = Wire::ok((hashes, exclude.map(str::to_owned)));
        call(&self.actor, "block tracker", self.timeout, |reply| BlockTrackerMsg::Query { query, reply })
            .await
    }

    /// How many blocks are registered.
    pub async fn block_count(&self) -> Result<usize, ActorError> {
        call(&self.actor, "block tracker", self.timeout, |reply| BlockTrackerMsg::Count { reply }).await
    }
}
