//! Running the `xinf` binary in tests: processes whose stderr is collected and that are
//! killed when dropped, and a local cluster serving the default model.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The `xinf` command in the C locale, without the environment that would change it. The
/// binary is this build's, or `XINF_TEST_BIN` (a test binary run on another machine than the
/// one that built it, e.g. a GPU host).
pub fn xinf() -> Command {
    let bin = std::env::var_os("XINF_TEST_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_xinf").into());
    let mut c = Command::new(bin);
    c.env("LANG", "C")
        .env_remove("XINF_API_KEY")
        .env_remove("XINF_CLUSTER_SECRET")
        .env_remove("XINF_ENDPOINT");
    c
}

/// `xinf chat` with the model `uid` of `endpoint`, greedy, fed `input` on stdin; its output.
pub fn xinf_chat(endpoint: &str, uid: &str, input: &str) -> std::process::Output {
    let mut child = xinf()
        .args(["chat", "-u", uid, "-e", endpoint, "--temperature", "0", "--max-tokens", "24"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run xinf chat");
    if let Some(mut stdin) = child.stdin.take() {
        let _ = std::io::Write::write_all(&mut stdin, input.as_bytes());
    }
    child.wait_with_output().expect("xinf chat output")
}

/// A running `xinf` process whose stderr is collected; killed when dropped.
pub struct Proc {
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Proc {
    pub fn spawn(mut cmd: Command) -> Self {
        let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn xinf");
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
                s.push_str(&line);
                s.push('\n');
            }
        });
        Self { child, stderr }
    }

    pub fn log(&self) -> String {
        self.stderr.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The text after `prefix` up to the end of its line, once the process has printed it.
    pub fn wait_for(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let log = self.log();
            if let Some(rest) = log.lines().find_map(|l| l.split_once(prefix).map(|(_, r)| r.to_owned())) {
                return rest;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("xinf exited ({status}) before printing {prefix:?}:\n{log}");
            }
            assert!(Instant::now() < deadline, "no {prefix:?} within 120 s:\n{log}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The process's resident anonymous memory (`RssAnon`: heap and stacks, not the mapped
    /// model file or libraries, whose pages come and go with the page cache), in bytes.
    pub fn anon_bytes(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("the process status");
        let kib = status
            .lines()
            .find_map(|l| l.strip_prefix("RssAnon:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .expect("RssAnon in the process status");
        kib << 10
    }

    /// Sends a signal (`-STOP`, `-CONT`, ...) to the process.
    pub fn signal(&self, sig: &str) {
        let pid = self.child.id().to_string();
        let ok = Command::new("kill").args([sig, &pid]).status().is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid} failed");
    }

    /// Waits at most `timeout` for the process to exit on its own; its status, if it did.
    pub fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `xinf local` on a free port with no model, with more environment; with its REST address.
pub fn bare_local(env: &[(&str, &str)]) -> (Proc, SocketAddr) {
    let mut cmd = xinf();
    cmd.args(["local", "--port", "0"]).envs(env.iter().copied());
    serving(cmd)
}

/// `cmd` (an `xinf local`) started, once its REST API is up; with its address.
fn serving(cmd: Command) -> (Proc, SocketAddr) {
    let mut p = Proc::spawn(cmd);
    let addr =
        p.wait_for("REST API at http://").trim().trim_end_matches("/v1").parse().expect("REST address");
    (p, addr)
}

/// `xinf local` on a free port serving the default model as `uid` (more launch flags in
/// `extra`), once the model is ready; with its REST address.
pub fn local(uid: &str, extra: &[&str]) -> (Proc, SocketAddr) {
    local_with_env(uid, extra, &[])
}

/// [`local`], with `env` set in the server's environment.
pub fn local_with_env(uid: &str, extra: &[&str], env: &[(&str, &str)]) -> (Proc, SocketAddr) {
    let mut cmd = xinf();
    cmd.args(["local", "--port", "0", "-n", "smollm2-instruct", "-u", uid]).args(extra);
    cmd.envs(env.iter().copied());
    let (mut p, addr) = serving(cmd);
    p.wait_for(&format!("Model `{uid}` is ready"));
    (p, addr)
}

pub use xinf_test_util::poll;
