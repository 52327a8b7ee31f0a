//! An engine server as a child process: started in its own process group (so stopping it stops
//! every process it started, such as vLLM's engine core and SGLang's scheduler), its output in a
//! log file whose last lines go into errors, a thread that notices at once when it exits, and a
//! health poll with a deadline.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use xinf_engine::EngineError;

/// How much of the log's end is read for an error message.
const TAIL_BYTES: u64 = 16 * 1024;
/// Lines of the log's end an error message quotes.
const TAIL_LINES: usize = 25;

/// What to start.
#[derive(Debug, Clone)]
pub(crate) struct Spawn {
    /// The interpreter (or any program).
    pub(crate) program: String,
    /// Its arguments.
    pub(crate) args: Vec<String>,
    /// Extra environment.
    pub(crate) env: Vec<(String, String)>,
    /// Where its standard output and error go (appended).
    pub(crate) log: PathBuf,
    /// What the process is, for messages (`the vllm server of replica m-0`).
    pub(crate) what: String,
}

/// A running engine server.
#[derive(Debug)]
pub(crate) struct ServerProcess {
    /// Its pid, which is also its process group's id.
    pid: u32,
    log: PathBuf,
    what: String,
    /// `Some(how it ended)` once the process has exited.
    exit: watch::Receiver<Option<String>>,
    /// Set by [`stop`](Self::stop): an exit that was asked for is no death.
    stopping: Arc<AtomicBool>,
}

impl ServerProcess {
    /// Starts the process in a new process group, its output appended to the log file.
    pub(crate) fn spawn(s: Spawn) -> Result<Self, EngineError> {
        if let Some(dir) = s.log.parent() {
            std::fs::create_dir_all(dir).map_err(|e| {
                EngineError::Process(format!("cannot create the log folder {}: {e}", dir.display()))
            })?;
        }
        let open = || {
            std::fs::OpenOptions::new().create(true).append(true).open(&s.log).map_err(|e| {
                EngineError::Process(format!("cannot open the log file {}: {e}", s.log.display()))
            })
        };
        let (out, err) = (open()?, open()?);
        let mut cmd = Command::new(&s.program);
        cmd.args(&s.args).envs(s.env.iter().cloned()).stdin(Stdio::null()).stdout(out).stderr(err);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        die_with_parent(&mut cmd);
        let mut child = spawn_from_keeper(cmd).map_err(|e| {
            EngineError::Process(format!("{} could not be started ({}): {e}", s.what, s.program))
        })?;
        let pid = child.id();
        tracing::info!(pid, log = %s.log.display(), what = %s.what, "started an engine server");
        let (tx, rx) = watch::channel(None);
        let what = s.what.clone();
        std::thread::Builder::new()
            .name(format!("xinf-wait-{pid}"))
            .spawn(move || {
                let how = match child.wait() {
                    Ok(status) => status.to_string(),
                    Err(e) => format!("could not be waited for ({e})"),
                };
                // Whatever the leader left behind goes with it.
                signal_group(pid, libc::SIGKILL);
                tracing::info!(pid, what = %what, %how, "an engine server exited");
                let _ = tx.send(Some(how));
            })
            .map_err(|e| EngineError::Process(format!("cannot start a thread to watch {}: {e}", s.what)))?;
        Ok(Self { pid, log: s.log, what: s.what, exit: rx, stopping: Arc::default() })
    }

    /// The log file.
    pub(crate) fn log(&self) -> &Path {
        &self.log
    }

    /// How the process ended, once it has.
    pub(crate) fn exit_status(&self) -> Option<String> {
        self.exit.borrow().clone()
    }

    /// The error a dead process stands for: what ended, how, and the end of its log.
    pub(crate) fn death(&self, how: &str) -> EngineError {
        death(&self.what, how, &self.log)
    }

    /// Resolves once the process has exited on its own, with the error it stands for; never
    /// after [`stop`](Self::stop) was called.
    pub(crate) fn exited(&self) -> impl std::future::Future<Output = EngineError> + Send + 'static {
        let mut rx = self.exit.clone();
        let (what, log, stopping) = (self.what.clone(), self.log.clone(), self.stopping.clone());
        async move {
            let how = match rx.wait_for(Option::is_some).await {
                Ok(how) => how.clone().unwrap_or_default(),
                Err(_) => "its watcher stopped".to_owned(),
            };
            if stopping.load(Ordering::Acquire) {
                std::future::pending::<()>().await;
            }
            death(&what, &how, &log)
        }
    }

    /// Whether [`stop`](Self::stop) was called.
    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Kills the whole process group at once (a hung server, which would not heed SIGTERM);
    /// the watching thread then sees it exit.
    pub(crate) fn kill(&self) {
        tracing::warn!(pid = self.pid, what = %self.what, "killing a hung engine server");
        signal_group(self.pid, libc::SIGKILL);
    }

    /// The error a hung server stands for: what, why, and the end of its log.
    pub(crate) fn hung(&self, why: &str) -> EngineError {
        EngineError::Process(format!(
            "{} stopped answering: {why}; xinf stopped it.{}",
            self.what,
            self.tail_text()
        ))
    }

    /// Polls `url` until it answers 200, the process exits, or the deadline passes (blocking).
    pub(crate) fn wait_healthy(&self, url: &str, timeout: Duration) -> Result<(), EngineError> {
        let deadline = Instant::now() + timeout;
        let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(5)).build();
        loop {
            if let Some(how) = self.exit_status() {
                return Err(self.death(&how));
            }
            if let Ok(r) = agent.get(url).call()
                && r.status() == 200
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(EngineError::Process(format!(
                    "{} did not become healthy within {} s (engine_config.launch_timeout_s sets the limit).{}",
                    self.what,
                    timeout.as_secs(),
                    self.tail_text()
                )));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Stops the server: SIGTERM to the server itself (it shuts its own workers down; a
    /// SIGTERM to all of them at once makes SGLang's parent take its crash path), then SIGKILL
    /// to the whole group after `grace`; returns once no process of the group is left
    /// (blocking).
    pub(crate) fn stop(&self, grace: Duration) {
        self.stopping.store(true, Ordering::Release);
        if !group_alive(self.pid) {
            return;
        }
        tracing::info!(pid = self.pid, what = %self.what, "stopping an engine server");
        if self.exit_status().is_none() {
            signal_process(self.pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while group_alive(self.pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if group_alive(self.pid) {
            tracing::warn!(pid = self.pid, what = %self.what, "the engine server ignored SIGTERM; killing it");
            signal_group(self.pid, libc::SIGKILL);
            let deadline = Instant::now() + Duration::from_secs(5);
            while group_alive(self.pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// The end of the log, as text to append to a message.
    fn tail_text(&self) -> String {
        tail_text(&self.log)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // Never leave an engine running behind a handle nobody holds.
        if self.exit_status().is_none() {
            signal_group(self.pid, libc::SIGKILL);
        }
    }
}

/// The error of a server that exited on its own: what, how, and the end of its log.
fn death(what: &str, how: &str, log: &Path) -> EngineError {
    EngineError::Process(format!("{what} exited ({how}).{}", tail_text(log)))
}

/// The last lines of a log file, introduced, or nothing when there are none.
pub(crate) fn tail_text(log: &Path) -> String {
    let lines = tail(log);
    if lines.is_empty() {
        return String::new();
    }
    format!(" Last lines of {}:\n{}", log.display(), lines.join("\n"))
}

/// The last [`TAIL_LINES`] non-empty lines of a file (nothing if it cannot be read), without
/// the server's access-log lines of xinf's own health checks, which would fill the tail of a
/// server that hung or died after a quiet while and push out what it said last.
fn tail(path: &Path) -> Vec<String> {
    let Ok(mut f) = File::open(path) else { return Vec::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if f.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES))).is_err() {
        return Vec::new();
    }
    let mut buf = Vec::new();
    if f.read_to_end(&mut buf).is_err() {
        return Vec::new();
    }
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> =
        text.lines().map(str::trim_end).filter(|l| !l.is_empty() && !is_health_check(l)).collect();
    lines[lines.len().saturating_sub(TAIL_LINES)..].iter().map(|l| (*l).to_owned()).collect()
}

/// Whether a log line is the access log's entry of a `GET /health` (uvicorn's, in vLLM and
/// SGLang: `INFO:     127.0.0.1:40112 - "GET /health HTTP/1.1" 200 OK`).
fn is_health_check(line: &str) -> bool {
    line.contains("\"GET /health HTTP/")
}

/// Makes the server get SIGTERM when xinf dies, however it dies: both engines stop their own
/// workers on SIGTERM (vLLM's engine core, SGLang's scheduler), which a SIGKILL of the server
/// alone would leave running, holding the GPU.
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and calls only prctl(2),
    // getppid(2) and _exit(2), which are async-signal-safe; it touches no lock or allocation.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            // xinf died between the fork and the prctl: nobody would ever stop this child.
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// Forks children from one thread that lives as long as the process. Linux sends the
/// parent-death signal when the *thread* that forked a child ends, so a child forked from a
/// loading thread (which tokio retires when idle) would be killed with that thread.
fn spawn_from_keeper(cmd: Command) -> std::io::Result<std::process::Child> {
    use std::sync::mpsc;
    type Job = (Command, mpsc::Sender<std::io::Result<std::process::Child>>);
    static KEEPER: std::sync::OnceLock<std::sync::Mutex<mpsc::Sender<Job>>> = std::sync::OnceLock::new();
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        let started = std::thread::Builder::new().name("xinf-engine-spawner".into()).spawn(move || {
            for (mut cmd, reply) in rx {
                let _ = reply.send(cmd.spawn());
            }
        });
        if let Err(e) = started {
            tracing::error!(error = %e, "cannot start the thread that starts engine servers");
        }
        std::sync::Mutex::new(tx)
    });
    let (reply, answer) = mpsc::channel();
    let sent = xinf_transfer::sync::lock(keeper).send((cmd, reply));
    if sent.is_err() {
        return Err(std::io::Error::other("the thread that starts engine servers is gone"));
    }
    answer.recv().map_err(|_| std::io::Error::other("the thread that starts engine servers is gone"))?
}

/// Sends `sig` to every process of the group `pgid`.
#[allow(unsafe_code)]
fn signal_group(pgid: u32, sig: libc::c_int) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else { return };
    if pgid <= 1 {
        return;
    }
    // SAFETY: kill(2) with a negative pid signals the process group; it reads no memory of ours.
    // The group id is that of a child started with its own group, never 0 or 1 (checked above),
    // so it cannot signal this process's own group or every process.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

/// Sends `sig` to the process `pid` alone.
#[allow(unsafe_code)]
fn signal_process(pid: u32, sig: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return };
    if pid <= 1 {
        return;
    }
    // SAFETY: kill(2) with a positive pid signals that process; it reads no memory of ours. The
    // pid is that of our own child, not yet reaped (its exit status is unknown), so it has not
    // been reused.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Whether any process of the group `pgid` is left.
#[allow(unsafe_code)]
fn group_alive(pgid: u32) -> bool {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else { return false };
    if pgid <= 1 {
        return false;
    }
    // SAFETY: signal 0 only checks that the group exists and may be signalled; see signal_group.
    unsafe { libc::kill(-pgid, 0) == 0 }
}
