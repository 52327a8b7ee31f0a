//! `xinf chat` as a person uses it: Ctrl-C while an answer streams stops only that answer (the
//! server aborts the request and keeps serving, the chat goes on), and on a terminal (a real
//! pseudo-terminal, driven by Python's `pty`) the line is edited with Home and the history recalls
//! a message with the Up arrow, kept in `~/.xinf/chat_history`.

use crate::util::http;
use crate::util::procs::{local, xinf};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Requests of model `uid` that ended, by finish reason `reason` (`None`: all), from `/metrics`.
fn finished(addr: SocketAddr, uid: &str, reason: Option<&str>) -> u64 {
    let text = http::get(addr, "/metrics").text();
    text.lines()
        .filter(|l| l.starts_with("xinf_requests_finished_total{") && l.contains(&format!("model=\"{uid}\"")))
        .filter(|l| reason.is_none_or(|r| l.contains(&format!("finish_reason=\"{r}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// One local cluster for both halves (a model load each would double the time).
#[test]
fn chat_stops_answers_on_ctrl_c_and_edits_lines_on_a_terminal() {
    let (_p, addr) = local("chatty", &[]);
    ctrl_c_stops_only_the_streaming_answer(addr);
    chat_edits_lines_and_recalls_history_on_a_terminal(addr);
}

fn ctrl_c_stops_only_the_streaming_answer(addr: SocketAddr) {
    let mut child = xinf()
        .args(["chat", "-u", "chatty", "-e", &format!("http://{addr}"), "--temperature", "0"])
        .args(["--max-tokens", "400"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run xinf chat");
    let mut stdin = child.stdin.take().expect("stdin");
    let out = Arc::new(Mutex::new(Vec::new()));
    let mut pipe = child.stdout.take().expect("stdout");
    let sink = out.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(&buf[..n]);
        }
    });
    let seen = || out.lock().unwrap_or_else(|p| p.into_inner()).len();
    stdin.write_all(b"Count from 1 to 1000, one number per line.\n").expect("write");
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen() < 12 {
        assert!(Instant::now() < deadline, "no answer streamed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let aborted = finished(addr, "chatty", Some("abort"));
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill");
    assert!(status.success());
    // The chat is still there: the next message gets its answer, then `exit` ends it.
    stdin.write_all(b"What is the capital of France?\nexit\n").expect("write");
    drop(stdin);
    let status = child.wait().expect("wait");
    reader.join().expect("reader");
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let text = String::from_utf8_lossy(&out.lock().unwrap_or_else(|p| p.into_inner())).into_owned();
    assert!(status.success(), "{status}: {err}\n{text}");
    assert!(err.contains("(answer stopped)"), "{err}");
    // The count stopped early (400 tokens would reach past 100), and the next answer came.
    let (count, after) =
        text.split_once("capital").map_or((text.as_str(), ""), |(a, _)| (a, &text[a.len()..]));
    assert!(count.lines().count() < 100, "the first answer ran on: {text}");
    assert!(after.contains("Paris"), "{text}");
    // The server aborted the stopped request (it noticed the closed connection) and served on.
    let start = Instant::now();
    while finished(addr, "chatty", Some("abort")) <= aborted {
        assert!(start.elapsed() < Duration::from_secs(30), "no request was aborted");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Drives `xinf chat` in a pseudo-terminal: types "capital of France?", Home, "What is the ",
/// Enter; after the answer (the next prompt at the start of a line) Up and Enter; then Ctrl-D.
/// Prints what the terminal showed; exits with the chat's exit status.
const PTY_DRIVER: &str = r#"
import os, pty, re, select, sys, time
xinf, endpoint, home = sys.argv[1:4]
pid, fd = pty.fork()
if pid == 0:
    env = dict(os.environ, HOME=home, LANG="C", TERM="xterm")
    os.execve(xinf, [xinf, "chat", "-u", "chatty", "-e", endpoint, "--temperature", "0",
                     "--max-tokens", "16"], env)
shown = b""
def prompts():
    # Prompts drawn at the start of a line, escape sequences and carriage returns aside.
    text = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]|\r", b"", shown)
    return text.count(b"\n> ") + text.startswith(b"> ")
def until(count, seconds):
    global shown
    end = time.time() + seconds
    while time.time() < end and prompts() < count:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                data = os.read(fd, 4096)
            except OSError:
                return
            if not data:
                return
            shown += data
until(1, 60)
os.write(fd, b"capital of France?\x1b[HWhat is the \r")
until(2, 120)
os.write(fd, b"\x1b[A\r")
until(3, 120)
os.write(fd, b"\x04")
_, status = os.waitpid(pid, 0)
sys.stdout.write(shown.decode("utf-8", "replace"))
sys.exit(os.waitstatus_to_exitcode(status))
"#;

fn chat_edits_lines_and_recalls_history_on_a_terminal(addr: SocketAddr) {
    let home = tempfile::tempdir().expect("home");
    let bin = std::env::var_os("XINF_TEST_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_xinf").into());
    let python = std::env::var("XINF_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let before = finished(addr, "chatty", None);
    let out = Command::new(python)
        .arg("-c")
        .arg(PTY_DRIVER)
        .arg(bin)
        .arg(format!("http://{addr}"))
        .arg(home.path())
        .output()
        .expect("run the pty driver");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}: {shown}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    assert!(shown.contains("Paris"), "{shown}");
    // Two questions reached the server: the typed one and the one recalled with Up.
    assert_eq!(finished(addr, "chatty", None), before + 2, "{shown}");
    // Home moved the cursor: the message sent (and kept) is the edited line.
    let history = std::fs::read_to_string(home.path().join(".xinf/chat_history")).expect("chat history");
    assert!(history.lines().any(|l| l == "What is the capital of France?"), "{history}");
}
