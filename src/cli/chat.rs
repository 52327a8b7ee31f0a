//! `xinf chat`: an interactive, streaming chat with a served model.

use super::launch::EndpointArgs;
use clap::Args;
use serde::Deserialize;
use serde_json::{Value, json};
use std::io::{BufRead, IsTerminal, Write};
use xinf_i18n::Catalog;

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

#[derive(Deserialize)]
struct Delta {
    content: Option<String>,
}

/// The text a chunk adds, if any (the usage chunk has no choices).
fn delta_text(event: &Value) -> Option<String> {
    let chunk = Chunk::deserialize(event).ok()?;
    chunk.choices.into_iter().next()?.delta.content
}

/// Checks that the server serves the model, then reads a message per line from stdin and
/// streams each answer to stdout, keeping the conversation. An empty line is skipped; `exit`, `quit` or end of input ends the chat.
pub(crate) fn chat(args: ChatArgs, cat: &Catalog) -> Result<(), String> {
    let client = args.endpoint.client();
    // Asked first, so that a mistyped uid is said before anything is typed.
    let served = client.models().map_err(|e| e.text(cat))?;
    if !served.iter().any(|m| m.uid == args.model_uid) {
        let names = served.iter().map(|m| m.uid.as_str()).collect::<Vec<_>>().join(", ");
        let names = if names.is_empty() { "-".to_owned() } else { names };
        return Err(cat.text("cli-chat-unknown-model", &[("uid", &args.model_uid), ("served", &names)]));
    }
    let interactive = std::io::stdin().is_terminal();
    let mut messages: Vec<Value> = Vec::new();
    if let Some(s) = &args.system {
        messages.push(json!({"role": "system", "content": s}));
    }
    if interactive {
        eprintln!("{}", cat.text("cli-chat-hello", &[("uid", &args.model_uid)]));
    }
    let mut lines = std::io::stdin().lock().lines();
    loop {
        if interactive {
            eprint!("> ");
            let _ = std::io::stderr().flush();
        }
        let Some(line) = lines.next() else { break };
        let line = line.map_err(|e| e.to_string())?;
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
        let mut out = std::io::stdout().lock();
        let streamed = client.stream("/v1/chat/completions", &body, |event| {
            if let Some(delta) = delta_text(event) {
                answer.push_str(&delta);
                let _ = out.write_all(delta.as_bytes());
                let _ = out.flush();
            }
        });
        let _ = writeln!(out);
        drop(out);
        match streamed {
            Ok(()) => messages.push(json!({"role": "assistant", "content": answer})),
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
