//! The block tracker: one per model, on the supervisor node. A thin actor around
//! [`state::BlockTrackerState`].

pub(crate) mod state;

use crate::error::ActorError;
use crate::wire::{answer, call_local};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use ractor_cluster::RactorMessage;
use state::{BlockLocation, BlockTrackerState};
use std::time::Duration;

/// Messages of the block tracker. Local only for now: replicas report blocks through the
/// supervisor node's handle.
#[derive(RactorMessage)]
pub(crate) enum BlockTrackerMsg {
    /// A replica holds these `(hash, block_id)` pairs.
    Register { replica_uid: String, blocks: Vec<(u64, u32)> },
    /// A replica freed these blocks.
    Unregister { replica_uid: String, block_ids: Vec<u32> },
    /// A replica is gone: forget all it held.
    UnregisterReplica { replica_uid: String },
    /// Who holds these hashes (other than `exclude`)?
    Query {
        hashes: Vec<u64>,
        exclude: Option<String>,
        reply: RpcReplyPort<Result<Vec<BlockLocation>, ActorError>>,
    },
    /// How many blocks are registered.
    Count { reply: RpcReplyPort<Result<usize, ActorError>> },
}

/// The block tracker actor.
pub(crate) struct BlockTracker;

impl Actor for BlockTracker {
    type Msg = BlockTrackerMsg;
    type State = BlockTrackerState;
    type Arguments = ();

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        _args: (),
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(BlockTrackerState::default())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            BlockTrackerMsg::Register { replica_uid, blocks } => state.register(&replica_uid, &blocks),
            BlockTrackerMsg::Unregister { replica_uid, block_ids } => {
                state.unregister(&replica_uid, &block_ids)
            }
            BlockTrackerMsg::UnregisterReplica { replica_uid } => {
                let n = state.unregister_replica(&replica_uid);
                tracing::debug!(%replica_uid, blocks = n, "block tracker purged a replica");
            }
            BlockTrackerMsg::Query { hashes, exclude, reply } => {
                answer(reply, Ok(state.query(&hashes, exclude.as_deref())));
            }
            BlockTrackerMsg::Count { reply } => answer(reply, Ok(state.len())),
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
        self.send(BlockTrackerMsg::Register { replica_uid: replica_uid.to_owned(), blocks })
    }

    /// Forgets some blocks of a replica.
    pub fn unregister(&self, replica_uid: &str, block_ids: Vec<u32>) -> Result<(), ActorError> {
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
        let exclude = exclude.map(str::to_owned);
        call_local(&self.actor, "block tracker", self.timeout, |reply| BlockTrackerMsg::Query {
            hashes,
            exclude,
            reply,
        })
        .await
    }

    /// How many blocks are registered.
    pub async fn block_count(&self) -> Result<usize, ActorError> {
        call_local(&self.actor, "block tracker", self.timeout, |reply| BlockTrackerMsg::Count { reply }).await
    }
}
