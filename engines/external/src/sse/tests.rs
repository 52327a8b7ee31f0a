use super::*;

#[test]
fn splits_events_across_pushes() {
    let mut d = SseDecoder::default();
    assert!(d.push(b"data: {\"a\"").expect("push").is_empty());
    let got = d.push(b":1}\n\ndata: [DONE]\n\n").expect("push");
    assert_eq!(got, vec!["{\"a\":1}".to_owned(), "[DONE]".to_owned()]);
    assert!(d.push(b"data: x\r\n\r\n: comment\n\n").expect("push") == vec!["x".to_owned()]);
    assert!(d.push(b"data: tail").expect("push").is_empty());
    assert_eq!(d.finish().as_deref(), Some("tail"));
}

#[test]
fn refuses_an_event_that_never_ends() {
    let mut d = SseDecoder::default();
    let big = vec![b'x'; MAX_EVENT_BYTES + 1];
    assert!(d.push(&big).is_err());
}
