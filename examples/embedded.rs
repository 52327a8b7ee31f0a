//! xinf embedded in another program, without HTTP: start a local cluster in this process,
//! launch the default model on two replicas, stream a chat answer, terminate.
//!
//! ```sh
//! cargo run --release --example embedded
//! ```

use futures::StreamExt;
use std::io::Write;
use xinf::actors::{Cluster, LaunchRequest};
use xinf::engine::{ChatMessage, GenerateRequest, Prompt, SamplingParams, TokenEvent};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cluster = Cluster::start_local(xinf::engines()).await?;
    let launch: LaunchRequest = serde_json::from_value(serde_json::json!({
        "model_uid": "smollm2",
        "model_name": "smollm2-instruct",
        "replica": 2,
        "kv_cache_tokens": 2048,
    }))?;
    let uid = cluster.launch(launch).await?;
    let mut stream = cluster
        .generate(
            &uid,
            GenerateRequest {
                request_id: String::new(), // the router picks an id
                prompt: Prompt::Chat(vec![ChatMessage::new("user", "What is the capital of France?")]),
                sampling: SamplingParams::greedy(32),
            },
        )
        .await?;
    let mut out = std::io::stdout().lock();
    while let Some(event) = stream.next().await {
        match event? {
            TokenEvent::Prompt(_) => {}
            TokenEvent::Delta { text, .. } => {
                out.write_all(text.as_bytes())?;
                out.flush()?;
            }
            TokenEvent::Finished { reason, usage } => {
                writeln!(
                    out,
                    "\n[{}; {} + {} tokens]",
                    reason.as_str(),
                    usage.prompt_tokens,
                    usage.completion_tokens
                )?;
            }
        }
    }
    for replica in cluster.stats(&uid).await? {
        writeln!(out, "{replica:?}")?;
    }
    cluster.terminate(&uid).await?;
    cluster.shutdown().await;
    Ok(())
}
