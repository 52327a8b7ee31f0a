//! Reasoning apart from the answer in an embedded server: a [`LocalService`] model given
//! `reasoning_content` by [`LocalService::set_chat_defaults`], on the shared default model
//! (earlier turns teach SmolLM2 to think before it answers). Every choice of a request is read
//! on its own, streamed and whole alike.

use super::{UID, chunks};
use crate::util::{self, http};
use serde_json::json;
use std::sync::Arc;
use xinf::actors::ChatDefaults;
use xinf::api::{self, ApiConfig, LocalService};
use xinf::engine::Engine;

#[test]
fn an_embedded_model_shows_each_choices_reasoning_apart() {
    let engine: Arc<dyn Engine> = util::shared_smollm2();
    let service = LocalService::new().with_model(UID, "smollm2-instruct", engine.clone()).with_model(
        "thinker",
        "smollm2-thinker",
        engine,
    );
    let reasoning =
        ChatDefaults { model_name: "smollm2-thinker".into(), reasoning_content: true, ..Default::default() };
    assert!(service.set_chat_defaults("thinker", reasoning));
    assert!(!service.set_chat_defaults("absent", ChatDefaults::default()));
    let rt = util::rt();
    let server = rt.block_on(api::serve(ApiConfig { port: 0, ..ApiConfig::default() }, Arc::new(service)));
    let server = server.expect("serve");
    let addr = server.local_addr();

    let messages = util::thinking_lesson("", ["Yes", "No"]);
    let ask = |model: &str, stream: bool| {
        let body = json!({"model": model, "messages": messages, "temperature": 0, "max_tokens": 30,
                          "n": 2, "stream": stream});
        let res = http::post(addr, "/v1/chat/completions", &body);
        assert_eq!(res.status, 200, "{}", res.text());
        res
    };
    let whole =
        ask(UID, false).json()["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned();
    let (thought, answer) = whole.split_once("</think>").expect("the closing mark");
    let read = ask("thinker", false).json();
    for i in 0..2 {
        let m = &read["choices"][i]["message"];
        assert_eq!(
            (m["reasoning_content"].as_str(), m["content"].as_str()),
            (Some(thought), Some(answer)),
            "{read}"
        );
    }
    let mut parts = [(String::new(), String::new()), (String::new(), String::new())];
    for chunk in chunks(&ask("thinker", true)) {
        let Some(choice) = chunk["choices"].get(0) else { continue };
        let i = choice["index"].as_u64().unwrap_or(9) as usize;
        parts[i].0.push_str(choice["delta"]["reasoning_content"].as_str().unwrap_or_default());
        parts[i].1.push_str(choice["delta"]["content"].as_str().unwrap_or_default());
    }
    for (r, c) in &parts {
        assert_eq!((r.as_str(), c.as_str()), (thought, answer));
    }
    rt.block_on(server.stop(false));
}
