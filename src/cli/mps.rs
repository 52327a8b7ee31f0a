//! NVIDIA's Multi-Process Service for a node whose replicas share GPUs (`--mps`).
//!
//! Without MPS, the processes on one GPU take turns: a prefill server and a decode server
//! placed together by memory shares each wait for the other's time slice, which costs a P/D
//! pair on one GPU a third of its throughput at C16 (`doc/bench/pd-engines.md`). Under MPS
//! their kernels run side by side. The daemon is started before the node touches CUDA, so every
//! CUDA user on the node (the engine servers xinf starts, the native engine and the transfer
//! actors in this process) becomes its client through the pipe directory they all see
//! (`CUDA_MPS_PIPE_DIRECTORY`, else the driver's `/tmp/nvidia-mps`).
//!
//! A daemon that already answers there is used and left running; one xinf started is told to
//! quit when xinf ends. Under MPS a fatal GPU fault in one client is reported to every client of
//! that GPU, so a crashing engine takes the other replicas on its GPU with it: that is why it is
//! a switch and not the default.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long one call of the control program may take.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a started daemon may take to answer.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long xinf waits, when it stops, for the daemon it started to quit (see [`quit`]).
const QUIT_WAIT: Duration = Duration::from_secs(2);

/// The MPS control daemon of this node, while xinf runs.
#[derive(Debug)]
pub(crate) struct Mps {
    program: String,
    /// Whether xinf started it (and so stops it).
    owned: bool,
}

/// How the daemon was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// Started by xinf; it quits when xinf ends.
    Started,
    /// Already running; left as it is.
    Running,
}

impl Mps {
    /// Uses the daemon that answers at the pipe directory, or starts one. The control program
    /// is `XINF_MPS_CONTROL`, else `nvidia-cuda-mps-control` from `PATH`; the daemon's log goes
    /// to `CUDA_MPS_LOG_DIRECTORY`, else xinf's `logs/mps`.
    pub(crate) fn start() -> Result<(Self, Found), String> {
        let program = std::env::var("XINF_MPS_CONTROL")
            .ok()
            .filter(|p| !p.trim().is_empty())
            .unwrap_or_else(|| "nvidia-cuda-mps-control".to_owned());
        let pipes = std::env::var_os("CUDA_MPS_PIPE_DIRECTORY")
            .filter(|d| !d.is_empty())
            .map_or_else(|| PathBuf::from("/tmp/nvidia-mps"), PathBuf::from);
        // Without its control socket no daemon runs there, and the control program need not be asked.
        if pipes.join("control").exists() && control(&program, "get_server_list").is_ok() {
            return Ok((Self { program, owned: false }, Found::Running));
        }
        let logs = std::env::var_os("CUDA_MPS_LOG_DIRECTORY")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| xinf_models::xinf_home().join("logs").join("mps"));
        std::fs::create_dir_all(&logs).map_err(|e| format!("cannot create {}: {e}", logs.display()))?;
        // The daemon it forks must not hold pipes of ours open: what the program says goes to a
        // file beside the daemon's own log.
        let said = logs.join("start.log");
        let opened = std::fs::File::create(&said).and_then(|f| Ok((f.try_clone()?, f)));
        let (out, err) = opened.map_err(|e| format!("cannot open {}: {e}", said.display()))?;
        let mut daemon = Command::new(&program);
        daemon.arg("-d").env("CUDA_MPS_LOG_DIRECTORY", &logs).stdout(out).stderr(err);
        let out = run(daemon, None).map_err(|e| format!("{program} -d: {e}"))?;
        if !out.ok {
            return Err(format!(
                "{program} -d failed ({}){}{}",
                out.text,
                tail(&said),
                tail(&logs.join("control.log"))
            ));
        }
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match control(&program, "get_server_list") {
                Ok(_) => return Ok((Self { program, owned: true }, Found::Started)),
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!(
                        "the daemon started by {program} -d did not answer within {} s ({e}){}",
                        START_TIMEOUT.as_secs(),
                        tail(&logs.join("control.log"))
                    ));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

impl Drop for Mps {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        match quit(&self.program) {
            Ok(true) => tracing::info!("the MPS control daemon xinf started has quit"),
            Ok(false) => tracing::info!(
                "the MPS control daemon xinf started was told to quit; it ends once its last client has, \
                 xinf itself included"
            ),
            Err(e) => tracing::warn!(error = %e, "the MPS control daemon xinf started could not be stopped"),
        }
    }
}

/// Tells the daemon to quit; whether it has within [`QUIT_WAIT`]. The daemon answers `quit`
/// once every client has gone, and this process is a client while it holds a CUDA context (the
/// native engine, the transfer actors), so the control program is left to finish after xinf
/// exits rather than killed: the daemon has the command either way.
fn quit(program: &str) -> Result<bool, String> {
    let mut child = Command::new(program)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(b"quit\n").map_err(|e| format!("cannot write to {program}: {e}"))?;
    }
    match wait_until(&mut child, Instant::now() + QUIT_WAIT) {
        Ok(Some(status)) if status.success() => Ok(true),
        Ok(Some(status)) => Err(format!("{program} said {status} to `quit`")),
        Ok(None) => Ok(false),
        Err(e) => Err(format!("cannot wait for {program}: {e}")),
    }
}

/// Polls `child` until it exits (its status) or `deadline` passes (`None`; it is left running).
fn wait_until(child: &mut Child, deadline: Instant) -> std::io::Result<Option<ExitStatus>> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends one command to the daemon; its answer, or why there is none.
fn control(program: &str, command: &str) -> Result<String, String> {
    let out = run(Command::new(program), Some(&format!("{command}\n")))?;
    if out.ok { Ok(out.text) } else { Err(out.text) }
}

/// What a finished program said.
struct Output {
    ok: bool,
    /// Standard output and error, trimmed.
    text: String,
}

/// Runs `cmd` for at most [`CONTROL_TIMEOUT`] (killed after that): with `input` on its
/// standard input and its output kept, or with no input and its output where `cmd` sends it.
/// The output is read once it has exited: the control program writes a few lines.
fn run(mut cmd: Command, input: Option<&str>) -> Result<Output, String> {
    if input.is_some() {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    } else {
        cmd.stdin(Stdio::null());
    }
    let mut child = cmd.spawn().map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if let (Some(mut stdin), Some(input)) = (child.stdin.take(), input) {
        // A program that exits without reading its input is not an error here.
        let _ = stdin.write_all(input.as_bytes());
    }
    let status = match wait_until(&mut child, Instant::now() + CONTROL_TIMEOUT) {
        Ok(Some(status)) => status,
        Ok(None) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{:?} did not finish within {} s",
                cmd.get_program(),
                CONTROL_TIMEOUT.as_secs()
            ));
        }
        Err(e) => return Err(format!("cannot wait for {:?}: {e}", cmd.get_program())),
    };
    let mut text = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = out.take(16 * 1024).read_to_string(&mut text);
    }
    if let Some(err) = child.stderr.take() {
        let _ = err.take(16 * 1024).read_to_string(&mut text);
    }
    let text = text.trim().to_owned();
    let text = if text.is_empty() { status.to_string() } else { text };
    Ok(Output { ok: status.success(), text })
}

/// The last lines of a log, for an error message (nothing when it is missing or empty).
fn tail(path: &std::path::Path) -> String {
    let Ok(log) = std::fs::read_to_string(path) else { return String::new() };
    let lines: Vec<&str> = log.lines().rev().take(5).collect();
    if lines.is_empty() {
        return String::new();
    }
    let lines: Vec<&str> = lines.into_iter().rev().collect();
    format!("\n{}:\n{}", path.display(), lines.join("\n"))
}
