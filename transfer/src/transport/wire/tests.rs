use super::{AnswerHead, BadRequest, Pages, Request, decode_device_stage, device_stage_body};
use crate::device::{DeviceRoute, DeviceStage};
use proptest::prelude::*;

fn pages() -> impl Strategy<Value = Pages> {
    (any::<u64>(), any::<u64>(), any::<u32>(), any::<u32>())
        .prop_map(|(room, provider, first, count)| Pages { room, provider, first, count })
}

fn route() -> impl Strategy<Value = DeviceRoute> {
    prop_oneof![Just(DeviceRoute::InProcess), Just(DeviceRoute::CudaIpc), Just(DeviceRoute::NixlVram)]
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        pages().prop_map(Request::Host),
        pages().prop_map(Request::Release),
        (pages(), any::<u32>()).prop_map(|(pages, timeout_ms)| Request::Nixl { pages, timeout_ms }),
        (pages(), any::<u32>(), route()).prop_map(|(pages, timeout_ms, route)| Request::Device {
            pages,
            timeout_ms,
            route
        }),
    ]
}

/// Reads requests off `bytes` the way the page server reads its connection, until the end or
/// the first frame that is not a request.
fn read_all(mut bytes: &[u8]) -> Vec<Result<Request, BadRequest>> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    runtime.block_on(async {
        let mut read = Vec::new();
        while let Some(request) = Request::read(&mut bytes).await.expect("read") {
            let bad = request.is_err();
            read.push(request);
            if bad {
                break;
            }
        }
        read
    })
}

proptest! {
    #[test]
    fn requests_round_trip(request in request()) {
        prop_assert_eq!(Request::decode(&request.encode()), Ok(request));
    }

    #[test]
    fn the_server_reads_back_to_back_requests(requests in prop::collection::vec(request(), 0..6)) {
        let bytes: Vec<u8> = requests.iter().flat_map(Request::encode).collect();
        prop_assert_eq!(read_all(&bytes), requests.into_iter().map(Ok).collect::<Vec<_>>());
    }

    #[test]
    fn a_cut_request_is_truncated(request in request(), cut in any::<usize>()) {
        let frame = request.encode();
        prop_assert_eq!(Request::decode(&frame[..cut % frame.len()]), Err(BadRequest::Truncated));
    }

    /// Whatever arrives on a page server's connection (its NIXL side channel included), reading
    /// it yields requests, a refusal naming what is wrong, or the end, without a panic.
    #[test]
    fn any_bytes_read_as_requests_a_refusal_or_the_end(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
        runtime.block_on(async {
            let mut rest = &bytes[..];
            // Every request takes at least one frame head: this many reads end it.
            for _ in 0..=bytes.len() / 4 {
                match Request::read(&mut rest).await {
                    Ok(Some(Ok(_))) => continue,
                    Ok(Some(Err(_)) | None) | Err(_) => return,
                }
            }
            panic!("more requests than frame heads in {} bytes", bytes.len());
        });
    }

    /// Any bytes as a GPU stage answer: a stage or a protocol error.
    #[test]
    fn any_bytes_as_a_gpu_stage_answer_are_a_stage_or_an_error(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_device_stage(&bytes);
    }

    #[test]
    fn answer_heads_round_trip(status in any::<u8>(), len in any::<u64>()) {
        let head = AnswerHead { status, len };
        prop_assert_eq!(AnswerHead::decode(head.encode()), head);
    }
}

#[test]
fn frames_are_the_documented_bytes() {
    let pages = Pages { room: 7, provider: 2, first: 3, count: 4 };
    let head =
        [&b"XKV1"[..], &7u64.to_le_bytes(), &2u64.to_le_bytes(), &3u32.to_le_bytes(), &4u32.to_le_bytes()]
            .concat();
    assert_eq!(Request::Host(pages).encode(), head);
    let nixl = Request::Nixl { pages, timeout_ms: 500 }.encode();
    assert_eq!(
        (&nixl[..4], &nixl[4..28], &nixl[28..]),
        (&b"XKN1"[..], &head[4..28], &500u32.to_le_bytes()[..])
    );
    let device = Request::Device { pages, timeout_ms: 500, route: DeviceRoute::CudaIpc }.encode();
    assert_eq!(device.len(), 33);
    assert_eq!(
        (&device[..4], &device[4..28], &device[28..32], device[32]),
        (&b"XKG1"[..], &head[4..28], &500u32.to_le_bytes()[..], 1)
    );
    let release = Request::Release(Pages { first: 0, count: 0, ..pages }).encode();
    assert_eq!((&release[..4], &release[4..20], release.len()), (&b"XKR1"[..], &head[4..20], 28));
    assert_eq!(AnswerHead { status: 1, len: 5 }.encode(), [1, 5, 0, 0, 0, 0, 0, 0, 0]);
    let stage = DeviceStage::CudaIpc { handle: "ab".into() };
    let body = device_stage_body(&stage, 3000);
    assert_eq!(body, br#"[{"cuda-ipc":{"handle":"ab"}},3000]"#);
    assert_eq!(decode_device_stage(&body), Ok((stage, 3000)));
}

#[test]
fn what_is_not_a_request_is_said() {
    assert_eq!(read_all(b"GET / HTTP/1.1"), [Err(BadRequest::Magic(*b"GET "))]);
    let mut frame = Request::Device {
        pages: Pages { room: 1, provider: 1, first: 0, count: 1 },
        timeout_ms: 1,
        route: DeviceRoute::NixlVram,
    }
    .encode();
    frame[32] = 9;
    assert_eq!(Request::decode(&frame), Err(BadRequest::Route(9)));
    frame.push(0);
    assert_eq!(Request::decode(&frame[..32]), Err(BadRequest::Truncated));
    frame[32] = 2;
    assert_eq!(Request::decode(&frame), Err(BadRequest::Trailing(1)));
    assert!(read_all(b"").is_empty());
}

#[tokio::test(start_paused = true)]
async fn half_a_request_times_out_and_an_idle_connection_closes() {
    use tokio::io::AsyncWriteExt;
    // A peer that sends the magic and 3 bytes, then nothing (keeping the connection open).
    let (mut client, mut server) = tokio::io::duplex(64);
    client.write_all(b"XKV1\x01\x02\x03").await.expect("write");
    let e = Request::read(&mut server).await.expect_err("timed out");
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    // A peer that connects and never sends: the connection is closed as if it had.
    let (_client, mut server) = tokio::io::duplex(64);
    assert!(matches!(Request::read(&mut server).await, Ok(None)));
}
