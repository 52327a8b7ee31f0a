//! Starting `xinf supervisor` and `xinf worker` processes for the cluster tests.

use super::SECRET;
use crate::util::procs::{Proc, xinf};
use std::net::SocketAddr;

pub(crate) fn supervisor() -> (Proc, SocketAddr, String) {
    supervisor_on(0, 0)
}

/// A supervisor with its REST and cluster ports given (0: a free one).
pub(crate) fn supervisor_on(port: u16, cluster_port: u16) -> (Proc, SocketAddr, String) {
    let mut cmd = xinf();
    let (port, cluster_port) = (port.to_string(), cluster_port.to_string());
    cmd.args(["supervisor", "--port", &port, "--cluster-port", &cluster_port])
        .env("XINF_CLUSTER_SECRET", SECRET);
    let mut p = Proc::spawn(cmd);
    let cluster = p.wait_for("Workers join at ").trim().to_owned();
    let rest = p.wait_for("REST API at http://");
    let addr = rest.trim().trim_end_matches("/v1").parse().expect("REST address");
    (p, addr, cluster)
}

pub(crate) fn worker(cluster: &str, secret: &str) -> (Proc, String) {
    worker_with_env(cluster, secret, &[])
}

/// [`worker`] with more environment (`XINF_LOG`, say).
pub(crate) fn worker_with_env(cluster: &str, secret: &str, env: &[(&str, &str)]) -> (Proc, String) {
    let mut cmd = xinf();
    cmd.args(["worker", "--supervisor", cluster]).env("XINF_CLUSTER_SECRET", secret);
    cmd.envs(env.iter().copied());
    let mut p = Proc::spawn(cmd);
    let joined = p.wait_for("Worker ");
    let id = joined.split_whitespace().next().expect("worker id").to_owned();
    (p, id)
}
