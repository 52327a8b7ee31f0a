//! The router's choices, as a pure state machine: round-robin per role among alive replicas,
//! and the table of running requests (duplicate ids refused; a lost replica names the requests
//! it takes down; a draining one is out of rotation and counts those it still serves).

use crate::spec::Role;
use std::collections::{BTreeMap, BTreeSet, HashMap};

#[cfg(test)]
mod tests;

/// Why a request could not be routed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RouteError {
    /// A request with this id is running.
    Duplicate,
    /// No alive replica has the role.
    NoReplica(Role),
}

/// Round-robin over a changing set of members.
#[derive(Debug, Default)]
struct RoundRobin {
    members: Vec<String>,
    next: usize,
}

impl RoundRobin {
    fn pick(&mut self) -> Option<&str> {
        if self.members.is_empty() {
            return None;
        }
        let i = self.next % self.members.len();
        self.next = (i + 1) % self.members.len();
        Some(&self.members[i])
    }

    fn remove(&mut self, uid: &str) -> bool {
        let Some(at) = self.members.iter().position(|m| m == uid) else { return false };
        self.members.remove(at);
        // Keep the turn of the member that would have come next.
        if at < self.next {
            self.next -= 1;
        }
        if self.members.is_empty() {
            self.next = 0;
        } else {
            self.next %= self.members.len();
        }
        true
    }
}

/// Replicas per role and the requests running on them.
#[derive(Debug, Default)]
pub(crate) struct RouterPolicy {
    pools: BTreeMap<Role, RoundRobin>,
    /// Replicas out of rotation that finish their running requests (their worker stops).
    draining: BTreeSet<String>,
    /// Running requests and the replicas they use (one, or a prefill and a decode replica).
    running: HashMap<String, Vec<String>>,
    /// P/D: with no prefill replica in rotation, a decode replica computes the whole request.
    prefill_fallback: bool,
}

impl RouterPolicy {
    /// A policy whose P/D requests go to a decode replica alone while no prefill replica is in
    /// rotation (`prefill_fallback`), or wait for one.
    pub(crate) fn new(prefill_fallback: bool) -> Self {
        Self { prefill_fallback, ..Self::default() }
    }

    /// Picks the replicas of a new request and records it as running: the next replica of the
    /// ordinary rotation, or the next prefill and decode replicas. With `prefill_fallback` and
    /// no prefill replica in rotation, the next decode replica alone, which computes the whole
    /// request.
    pub(crate) fn begin_request(&mut self, request_id: &str) -> Result<(Option<String>, String), RouteError> {
        if !self.is_pd() {
            return self.begin(request_id, Role::Hybrid).map(|r| (None, r));
        }
        match self.begin_pd(request_id) {
            Err(RouteError::NoReplica(Role::Prefill)) if self.prefill_fallback => {
                self.begin(request_id, Role::Decode).map(|d| (None, d))
            }
            picked => picked.map(|(p, d)| (Some(p), d)),
        }
    }

    /// Whether `prefill_fallback` is on.
    pub(crate) fn falls_back(&self) -> bool {
        self.prefill_fallback
    }

    /// Adds an alive replica to its role's rotation.
    pub(crate) fn add(&mut self, replica_uid: &str, role: Role) {
        self.draining.remove(replica_uid);
        let pool = self.pools.entry(role).or_default();
        if !pool.members.iter().any(|m| m == replica_uid) {
            pool.members.push(replica_uid.to_owned());
        }
    }

    /// Takes a replica out of rotation; returns the ids of the requests running on it, which
    /// are forgotten too.
    pub(crate) fn remove(&mut self, replica_uid: &str) -> Vec<String> {
        for pool in self.pools.values_mut() {
            pool.remove(replica_uid);
        }
        self.draining.remove(replica_uid);
        let ids: Vec<String> = self
            .running
            .iter()
            .filter(|(_, used)| used.iter().any(|r| r == replica_uid))
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ids {
            self.running.remove(id);
        }
        ids
    }

    /// Takes a replica out of rotation for new requests but leaves its running ones be (its
    /// worker is stopping and lets them finish); returns how many requests still use it.
    pub(crate) fn drain(&mut self, replica_uid: &str) -> usize {
        let mut was_in = false;
        for pool in self.pools.values_mut() {
            was_in |= pool.remove(replica_uid);
        }
        if was_in {
            self.draining.insert(replica_uid.to_owned());
        }
        self.running.values().filter(|used| used.iter().any(|r| r == replica_uid)).count()
    }

    /// Picks the next replica of `role` for a new request and records the request as running.
    pub(crate) fn begin(&mut self, request_id: &str, role: Role) -> Result<String, RouteError> {
        if self.running.contains_key(request_id) {
            return Err(RouteError::Duplicate);
        }
        let replica =
            self.pools.get_mut(&role).and_then(RoundRobin::pick).ok_or(RouteError::NoReplica(role))?;
        let replica = replica.to_owned();
        self.running.insert(request_id.to_owned(), vec![replica.clone()]);
        Ok(replica)
    }

    /// Whether the model is deployed with prefill and decode replicas.
    pub(crate) fn is_pd(&self) -> bool {
        self.pools.keys().any(|r| *r != Role::Hybrid)
    }

    /// Picks the next prefill and the next decode replica (round-robin within each role) for a
    /// new request and records it as running on both.
    pub(crate) fn begin_pd(&mut self, request_id: &str) -> Result<(String, String), RouteError> {
        if self.running.contains_key(request_id) {
            return Err(RouteError::Duplicate);
        }
        let has = |p: &BTreeMap<Role, RoundRobin>, r| p.get(&r).is_some_and(|rr| !rr.members.is_empty());
        for role in [Role::Prefill, Role::Decode] {
            if !has(&self.pools, role) {
                return Err(RouteError::NoReplica(role));
            }
        }
        let pick = |p: &mut BTreeMap<Role, RoundRobin>, r| {
            p.get_mut(&r).and_then(RoundRobin::pick).map(str::to_owned).ok_or(RouteError::NoReplica(r))
        };
        let prefill = pick(&mut self.pools, Role::Prefill)?;
        let decode = pick(&mut self.pools, Role::Decode)?;
        self.running.insert(request_id.to_owned(), vec![prefill.clone(), decode.clone()]);
        Ok((prefill, decode))
    }

    /// A P/D request's prefill is over (its decode replica holds the KV): from now on it runs
    /// on its decode replica alone, and only that replica's loss ends it.
    pub(crate) fn prefill_done(&mut self, request_id: &str) {
        if let Some(used) = self.running.get_mut(request_id)
            && used.len() == 2
        {
            used.remove(0);
        }
    }

    /// With `prefill_fallback`, the requests still in their prefill on `replica_uid`, which is
    /// lost: each is taken off it (as if its prefill were done) and returned, to run whole on its
    /// decode replica instead of failing. Without it, none.
    pub(crate) fn spare_prefills_on(&mut self, replica_uid: &str) -> Vec<String> {
        if !self.prefill_fallback {
            return Vec::new();
        }
        let ids: Vec<String> = self
            .running
            .iter()
            .filter(|(_, used)| used.len() == 2 && used[0] == replica_uid)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ids {
            self.prefill_done(id);
        }
        ids
    }

    /// A request ended; returns the replicas it used, if it was running.
    pub(crate) fn finish(&mut self, request_id: &str) -> Option<Vec<String>> {
        self.running.remove(request_id)
    }

    /// Every replica in rotation, with its role.
    pub(crate) fn replicas(&self) -> Vec<(String, Role)> {
        self.pools.iter().flat_map(|(role, p)| p.members.iter().map(|m| (m.clone(), *role))).collect()
    }

    /// The replicas out of rotation that still finish their requests.
    pub(crate) fn draining(&self) -> impl Iterator<Item = &str> {
        self.draining.iter().map(String::as_str)
    }

    /// Forgets the draining replicas that run no request any more, and returns them: nothing
    /// is routed to them again, and their worker stops them (a replacement may have taken
    /// their place in the model, so nothing else would tell the router they are gone).
    pub(crate) fn drop_drained(&mut self) -> Vec<String> {
        let busy: BTreeSet<&String> = self.running.values().flatten().collect();
        let idle: Vec<String> = self.draining.iter().filter(|r| !busy.contains(r)).cloned().collect();
        for uid in &idle {
            self.draining.remove(uid);
        }
        idle
    }
}
