//! The stream of a decode leg that continues after a first token the caller was shown already:
//! the server took that token as its prompt's last (vLLM recomputes the last prompt token and
//! would otherwise sample the first output anew), so it is put back in front of the output.

use futures::StreamExt;
use xinf_engine::{EngineError, TokenEvent, TokenLogprobs, TokenStream};

type Event = Result<TokenEvent, EngineError>;

/// `stream`, the server's events, with the token `token_id` (text `text`, log-probabilities
/// `logprobs` as the prefill reported them) in front, and the usage counting it as output
/// rather than prompt.
///
/// The token comes only once the server's own first event has arrived: whoever waits for the
/// first event of a decode stream (the replica, before the handoff's room is released) then
/// knows the server has loaded the KV. A stream whose first event is an error never shows it.
pub(crate) fn lead_first(
    stream: TokenStream,
    token_id: u32,
    text: String,
    logprobs: Option<Box<TokenLogprobs>>,
) -> TokenStream {
    struct State {
        stream: TokenStream,
        lead: Option<TokenEvent>,
        pending: Option<Event>,
    }
    let state = State { stream, lead: Some(TokenEvent::Delta { token_id, text, logprobs }), pending: None };
    Box::pin(futures::stream::unfold(state, |mut s| async move {
        if let Some(event) = s.pending.take() {
            return Some((event, s));
        }
        let next = as_output(s.stream.next().await?);
        match s.lead.take() {
            Some(lead) if next.is_ok() => {
                s.pending = Some(next);
                Some((Ok(lead), s))
            }
            _ => Some((next, s)),
        }
    }))
}

/// The lead token moves from the prompt to the output in a finished request's usage.
fn as_output(event: Event) -> Event {
    match event {
        Ok(TokenEvent::Finished { reason, mut usage }) => {
            usage.prompt_tokens = usage.prompt_tokens.saturating_sub(1);
            usage.completion_tokens += 1;
            Ok(TokenEvent::Finished { reason, usage })
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use xinf_engine::{FinishReason, Usage};

    fn delta(token_id: u32, text: &str) -> TokenEvent {
        TokenEvent::Delta { token_id, text: text.into(), logprobs: None }
    }

    #[tokio::test]
    async fn the_lead_token_waits_for_the_server_s_first_event_and_counts_as_output() {
        let (tx, rx) = futures::channel::mpsc::unbounded::<Event>();
        let mut s = lead_first(rx.boxed(), 7, " a".into(), None);
        assert!(s.next().now_or_never().is_none(), "nothing before the server's first event");
        tx.unbounded_send(Ok(delta(8, " b"))).expect("send");
        let usage = Usage { prompt_tokens: 11, completion_tokens: 1 };
        tx.unbounded_send(Ok(TokenEvent::Finished { reason: FinishReason::Length, usage })).expect("send");
        drop(tx);
        let events: Vec<TokenEvent> = s.map(|e| e.expect("ok")).collect().await;
        let usage = Usage { prompt_tokens: 10, completion_tokens: 2 };
        assert_eq!(
            events,
            [delta(7, " a"), delta(8, " b"), TokenEvent::Finished { reason: FinishReason::Length, usage }]
        );
    }

    #[tokio::test]
    async fn a_server_that_fails_first_never_shows_the_lead_token() {
        let failed = futures::stream::iter([Err(EngineError::Rejected("no".into()))]).boxed();
        let events: Vec<Event> = lead_first(failed, 7, " a".into(), None).collect().await;
        assert_eq!(events, [Err(EngineError::Rejected("no".into()))]);
    }
}
