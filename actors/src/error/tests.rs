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
