//! Classes and codes of actor errors.

use super::*;

#[test]
fn classes_and_codes() {
    let e = ActorError::launch(LaunchRule::GpuConflict, "GPU conflict");
    assert_eq!((e.class(), e.code()), (ErrorClass::InvalidInput, "gpu_conflict"));
    assert_eq!(e.to_string(), "GPU conflict");
    assert_eq!(e.launch_field(), Some("gpu_idx"), "the rule's own field");
    assert_eq!(e.at("replica_config[2].devices").launch_field(), Some("replica_config[2].devices"));
    let e = ActorError::NotReady { model_uid: "m".into(), status: "launching".into() };
    assert_eq!((e.class(), e.code()), (ErrorClass::Unavailable, "model_not_ready"));
    let e = ActorError::DuplicateRequest("r1".into());
    assert_eq!(e.to_string(), "Request r1 is already running");
    assert_eq!(e.class(), ErrorClass::Conflict);
    let e = ActorError::from(EngineError::Aborted);
    assert_eq!((e.class(), e.code()), (ErrorClass::Cancelled, "aborted"));
    assert_eq!(e.clone().into_engine_error(), EngineError::Aborted);
    let e = ActorError::Timeout { what: "worker w".into(), after_ms: 5 };
    // A peer that does not answer is "try later" on the stream too, not the request's fault.
    assert!(matches!(e.into_engine_error(), EngineError::Process(m) if m.contains("worker w")));
    let e = ActorError::launch(LaunchRule::GpuConflict, "GPU conflict");
    assert!(matches!(e.into_engine_error(), EngineError::Rejected(m) if m == "GPU conflict"));
    let e = ActorError::NoReplica { model_uid: "m".into(), role: Some(crate::spec::Role::Decode) };
    assert_eq!(e.to_string(), "model `m` has no alive decode replica; retry once one serves again");
    assert_eq!(e.class(), ErrorClass::Unavailable);
    let e = ActorError::NixlNotAvailable("NIXL is not available: libnixl_capi.so was not found".into());
    assert!(e.to_string().contains("transfer_backend_type \"xavier\""), "{e}");
}

#[test]
fn errors_survive_the_wire() {
    use ractor::BytesConvertable;
    let original: Result<u32, ActorError> = Err(ActorError::launch(
        LaunchRule::PdTopology,
        "PD separation requires both prefill and decode replicas",
    ));
    let bytes = crate::wire::Wire(original.clone()).into_bytes();
    assert_eq!(crate::wire::Wire::<u32>::from_bytes(bytes).0, original);
    let garbage = crate::wire::Wire::<String>::from_bytes(vec![0xff, 0xff, 0xff]);
    assert!(matches!(garbage.0, Err(ActorError::Wire(_))));
}

#[test]
fn a_payload_stating_a_huge_length_is_refused_without_allocating_it() {
    use ractor::BytesConvertable;
    // `Ok` (variant 0), then a byte string stating 2^40 bytes (varint 253 = u64 follows) and
    // holding 3.
    let mut bytes = vec![0u8, 253];
    bytes.extend_from_slice(&(1u64 << 40).to_le_bytes());
    bytes.extend_from_slice(b"abc");
    let decoded = crate::wire::Wire::<Vec<u8>>::from_bytes(bytes.clone()).0;
    assert!(matches!(decoded, Err(ActorError::Wire(_))), "{decoded:?}");
    let decoded = crate::wire::Wire::<String>::from_bytes(bytes).0;
    assert!(matches!(decoded, Err(ActorError::Wire(_))), "{decoded:?}");
}

proptest::proptest! {
    /// Whatever bytes arrive as a cluster payload, decoding answers (a value or a typed
    /// error) without panicking or allocating what the bytes claim.
    #[test]
    fn any_bytes_decode_to_a_value_or_a_typed_error(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
        use ractor::BytesConvertable;
        use crate::wire::Wire;
        let _ = Wire::<Vec<String>>::from_bytes(bytes.clone()).0;
        let _ = Wire::<crate::view::ModelInfo>::from_bytes(bytes.clone()).0;
        let _ = Wire::<xinf_engine::GenerateRequest>::from_bytes(bytes.clone()).0;
        let _ = Wire::<Vec<u8>>::from_bytes(bytes).0;
    }

    /// A stated length past the limit is refused whatever it is.
    #[test]
    fn stated_lengths_past_the_limit_are_refused(len in (16u64 << 20) + 1..u64::MAX) {
        use ractor::BytesConvertable;
        let mut bytes = vec![0u8, 253];
        bytes.extend_from_slice(&len.to_le_bytes());
        let decoded = crate::wire::Wire::<Vec<u8>>::from_bytes(bytes).0;
        proptest::prop_assert!(matches!(decoded, Err(ActorError::Wire(_))));
    }
}
