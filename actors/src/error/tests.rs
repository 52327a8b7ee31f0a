//! Classes and codes of actor errors.

use super::*;

#[test]
fn classes_and_codes() {
    let e = ActorError::launch(LaunchRule::GpuConflict, "GPU conflict");
    assert_eq!((e.class(), e.code()), (ErrorClass::InvalidInput, "gpu_conflict"));
    assert_eq!(e.to_string(), "GPU conflict");
    let e = ActorError::NotReady { model_uid: "m".into(), status: "launching".into() };
    assert_eq!((e.class(), e.code()), (ErrorClass::Unavailable, "model_not_ready"));
    let e = ActorError::DuplicateRequest("r1".into());
    assert_eq!(e.to_string(), "Request r1 is already running");
    assert_eq!(e.class(), ErrorClass::Conflict);
    let e = ActorError::from(EngineError::Aborted);
    assert_eq!((e.class(), e.code()), (ErrorClass::Cancelled, "aborted"));
    assert_eq!(e.clone().into_engine_error(), EngineError::Aborted);
    let e = ActorError::Timeout { what: "worker w".into(), after_ms: 5 };
    assert!(matches!(e.into_engine_error(), EngineError::Model(m) if m.contains("worker w")));
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
