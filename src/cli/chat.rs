//! `xinf chat`: an interactive, streaming chat with a served model.
//!
//! On a terminal the message is edited like a shell's line (arrows, Home/End, word moves,
//! Ctrl-R search; rustyline), with the history kept in `~/.xinf/chat_history` from chat to chat.
//! Ctrl-C while an answer streams stops only that answer: the connection is closed, so the
//! server aborts the request, and the next prompt comes. Ctrl-C at the prompt clears the line;
//! Ctrl-D, `exit` or `quit` ends the chat. With stdin not a terminal (a script), messages are
//! read line by line, and Ctrl-C stops the answer being streamed all the same.

use super::client::Client;
use super::launch::EndpointArgs;
use clap::Args;
use rustyline::error::ReadlineError;
use serde::Deserialize;
use serde_json::{Value, json};
use std::io::{BufRead, IsTerminal, Write};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use xinf_i18n::Catalog;

/// Whether an answer is streaming: Ctrl-C then stops it instead of ending the program.
static STREAMING: AtomicBool = AtomicBool::new(false);
/// Set by Ctrl-C while an answer streams; read before each streamed event.
static STOP: AtomicBool = AtomicBool::new(false);

/// Ctrl-C stops the streaming answer, or ends the program (exit status 130, as a shell's) when
/// none streams or a second Ctrl-C comes before the answer stopped. At an interactive prompt the terminal is in raw mode, so Ctrl-C reaches the
/// line editor as a key instead.
fn catch_interrupts() -> Result<(), String> {
    ctrlc::set_handler(|| {
        // A second Ctrl-C before the answer noticed the first (no token came yet) ends it all.
        if !STREAMING.load(Ordering::SeqCst) || STOP.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
    })
    .map_err(|e| e.to_string())
}

/// Where the messages come from.
enum Input {
    /// A terminal: a line editor with history, saved to the file when the chat ends.
    Editor(Box<rustyline::DefaultEditor>, Option<PathBuf>),
    /// Anything else: lines as they come.
    Lines(std::io::Lines<std::io::StdinLock<'static>>),
}

impl Input {
    fn open() -> Self {
        if std::io::stdin().is_terminal()
            && let Ok(mut editor) = rustyline::DefaultEditor::new()
        {
            let history =
                std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".xinf").join("chat_history"));
            if let Some(h) = &history {
                let _ = editor.load_history(h);
            }
            return Self::Editor(Box::new(editor), history);
        }
        Self::Lines(std::io::stdin().lock().lines())
    }

    /// The next message; `None` at the end of input (Ctrl-D).
    fn next(&mut self) -> Option<Result<String, String>> {
        match self {
            Self::Lines(lines) => lines.next().map(|l| l.map_err(|e| e.to_string())),
            Self::Editor(editor, _) => loop {
                match editor.readline("> ") {
                    Ok(line) => {
                        if !line.trim().is_empty() {
                            let _ = editor.add_history_entry(line.as_str());
                        }
                        return Some(Ok(line));
                    }
                    Err(ReadlineError::Interrupted) => continue,
                    Err(ReadlineError::Eof) => return None,
                    Err(e) => return Some(Err(e.to_string())),
                }
            },
        }
    }

    /// Keeps the history for the next chat (best effort: a chat never fails for it).
    fn close(self) {
        if let Self::Editor(mut editor, Some(path)) = self {
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let _ = editor.save_history(&path);
        }
    }
}

/// `xinf chat`.
#[derive(Debug, Args)]
pub(crate) struct ChatArgs {
    /// The model's uid (see `xinf list`).
    #[arg(short = 'u', long)]
    model_uid: String,
    #[command(flatten)]
    endpoint: EndpointArgs,
    /// A system message that starts the conversation.
    #[arg(long)]
    system: Option<String>,
    /// Tokens to generate at most per answer.
    #[arg(long, default_value_t = 512)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    /// Seed for reproducible sampling.
    #[arg(long)]
    seed: Option<u64>,
}

/// A streamed chat chunk, as far as the chat reads it.
#[derive(Deserialize)]
struct Chunk {
    choices: Vec<ChunkChoice>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    delta: Delta,
}

#[derive(Deserialize, Default)]
struct Delta {
    content: Option<String>,
    /// A reasoning model's thinking (a model launched with `reasoning_content`).
    reasoning_content: Option<String>,
}

/// What a chunk adds, if anything (the usage chunk has no choices).
fn delta_of(event: &Value) -> Delta {
    let chunk = Chunk::deserialize(event).ok();
    chunk.and_then(|c| c.choices.into_iter().next()).map(|c| c.delta).unwrap_or_default()
}

/// Where a reasoning model's thinking goes: standard error, so that standard output holds the
/// answers alone; faint on a terminal.
struct Thinking {
    faint: bool,
    shown: bool,
}

impl Thinking {
    fn new() -> Self {
        Self { faint: std::io::stderr().is_terminal(), shown: false }
    }

    fn show(&mut self, text: &str) {
        let mut err = std::io::stderr().lock();
        let _ = if self.faint { write!(err, "\x1b[2m{text}\x1b[0m") } else { write!(err, "{text}") };
        let _ = err.flush();
        self.shown = true;
    }

    /// Ends the thinking's line before the answer starts.
    fn end(&mut self) {
        if std::mem::take(&mut self.shown) {
            eprintln!();
        }
    }
}

/// Checks that the server serves the model, then reads a message per line from stdin and
/// streams each answer to stdout, keeping the conversation. An empty line is skipped; `exit`,
/// `quit` or end of input ends the chat.
pub(crate) fn chat(args: ChatArgs, cat: &Catalog) -> Result<(), String> {
    let client = args.endpoint.client();
    // Asked first, so that a mistyped uid is said before anything is typed.
    let served = client.models().map_err(|e| e.text(cat))?;
    if !served.iter().any(|m| m.uid == args.model_uid) {
        let names = served.iter().map(|m| m.uid.as_str()).collect::<Vec<_>>().join(", ");
        let names = if names.is_empty() { "-".to_owned() } else { names };
        return Err(cat.text("cli-chat-unknown-model", &[("uid", &args.model_uid), ("served", &names)]));
    }
    catch_interrupts()?;
    let mut input = Input::open();
    let interactive = matches!(input, Input::Editor(..));
    let mut messages: Vec<Value> = Vec::new();
    if let Some(s) = &args.system {
        messages.push(json!({"role": "system", "content": s}));
    }
    if interactive {
        eprintln!("{}", cat.text("cli-chat-hello", &[("uid", &args.model_uid)]));
    }
    let ended = converse(&args, cat, &client, &mut input, interactive, &mut messages);
    input.close();
    ended
}

/// The chat's turns, until the input ends or a turn fails where nobody can retry.
fn converse(
    args: &ChatArgs,
    cat: &Catalog,
    client: &Client,
    input: &mut Input,
    interactive: bool,
    messages: &mut Vec<Value>,
) -> Result<(), String> {
    while let Some(line) = input.next() {
        let line = line?;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if line == "exit" || line == "quit" {
            break;
        }
        messages.push(json!({"role": "user", "content": line}));
        let mut body = json!({
            "model": args.model_uid,
            "messages": messages,
            "stream": true,
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
        });
        if let Some(seed) = args.seed {
            body["seed"] = seed.into();
        }
        let mut answer = String::new();
        let mut thinking = Thinking::new();
        let mut out = std::io::stdout().lock();
        STOP.store(false, Ordering::SeqCst);
        STREAMING.store(true, Ordering::SeqCst);
        let streamed = client.stream("/v1/chat/completions", &body, |event| {
            if STOP.load(Ordering::SeqCst) {
                return ControlFlow::Break(());
            }
            let delta = delta_of(event);
            if let Some(thought) = delta.reasoning_content {
                thinking.show(&thought);
            }
            if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                thinking.end();
                answer.push_str(&text);
                let _ = out.write_all(text.as_bytes());
                let _ = out.flush();
            }
            ControlFlow::Continue(())
        });
        STREAMING.store(false, Ordering::SeqCst);
        thinking.end();
        let _ = writeln!(out);
        drop(out);
        match streamed {
            Ok(flow) => {
                if flow.is_break() {
                    eprintln!("{}", cat.text("cli-chat-stopped", &[]));
                }
                // A stopped answer stays in the conversation as far as it went.
                messages.push(json!({"role": "assistant", "content": answer}));
            }
            Err(e) => {
                // The turn failed: forget it, say why, and go on unless nobody is there.
                messages.pop();
                if !interactive || e.status().is_none() {
                    return Err(e.text(cat));
                }
                eprintln!("{}: {}", cat.text("error-prefix", &[]), e.text(cat));
            }
        }
    }
    Ok(())
}
