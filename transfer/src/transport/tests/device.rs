use super::{Pattern, T};
use crate::device::{DeviceLease, DevicePages, DeviceRoute, DeviceStage};
use crate::transport::{
    Endpoint, PageProvider, PageServer, TransferError, TransportKind, fetch_device, process_nonce,
};
use futures::FutureExt;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;

/// Staging memory of the device-route tests: host bytes standing in for GPU memory, with a flag
/// set when the provider gets it back.
struct Staging {
    bytes: Vec<u8>,
    freed: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for Staging {
    fn drop(&mut self) {
        self.freed.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Stages room 7's pages (as [`Pattern`]) and describes them for the route asked for.
struct DevicePattern {
    freed: Arc<std::sync::atomic::AtomicBool>,
}

impl PageProvider for DevicePattern {
    fn pages(&self, room: u64, first: u32, count: u32) -> BoxFuture<'static, Result<Vec<u8>, TransferError>> {
        Pattern.pages(room, first, count)
    }

    fn device_pages(
        &self,
        room: u64,
        first: u32,
        count: u32,
        route: DeviceRoute,
    ) -> BoxFuture<'static, Result<DeviceLease, TransferError>> {
        let freed = self.freed.clone();
        let pages = Pattern.pages(room, first, count);
        async move {
            let bytes = pages.await?;
            let len = bytes.len();
            let stage = match route {
                DeviceRoute::InProcess => DeviceStage::InProcess,
                DeviceRoute::CudaIpc => DeviceStage::CudaIpc { handle: format!("room-{room}") },
                DeviceRoute::NixlVram => DeviceStage::NixlVram { remote: bytes.clone() },
            };
            freed.store(false, std::sync::atomic::Ordering::SeqCst);
            Ok(DeviceLease::new(stage, len, Box::new(Staging { bytes, freed })))
        }
        .boxed()
    }
}

/// Receives by copying the staging's bytes (in process) or the stage's own bytes (NIXL); checks
/// that the provider still holds its staging during the copy; sleeps `delay` first.
struct Sink {
    freed: Arc<std::sync::atomic::AtomicBool>,
    delay: Duration,
}

impl crate::device::DeviceSink for Sink {
    fn receive(
        &self,
        lease: &DeviceLease,
        _deadline: std::time::Instant,
    ) -> Result<DevicePages, TransferError> {
        std::thread::sleep(self.delay);
        if self.freed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(TransferError::Source("the staging was freed before the copy".into()));
        }
        let bytes = match lease.stage() {
            DeviceStage::InProcess => lease.held::<Staging>().map(|s| s.bytes.clone()),
            DeviceStage::NixlVram { remote } => Some(remote.clone()),
            DeviceStage::CudaIpc { handle } => Some(handle.as_bytes().to_vec()),
        }
        .ok_or_else(|| TransferError::Source("no staging".into()))?;
        Ok(DevicePages::new(lease.len(), Box::new(bytes)))
    }
}

#[tokio::test]
async fn device_routes_describe_the_staging_and_free_it_after_the_copy() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let server = PageServer::start("127.0.0.1".parse().expect("ip")).await.expect("server");
    let freed = Arc::new(AtomicBool::new(true));
    let provider: Arc<dyn PageProvider> = Arc::new(DevicePattern { freed: freed.clone() });
    let reg = server.register(&provider);
    let sink = || -> Arc<dyn crate::device::DeviceSink> {
        Arc::new(Sink { freed: freed.clone(), delay: Duration::from_millis(20) })
    };
    let want: Vec<u8> = (2..5u8).flat_map(|i| vec![i; 1000]).collect();
    let cases = [
        (DeviceRoute::InProcess, TransportKind::DeviceInProcess, want.clone()),
        (DeviceRoute::NixlVram, TransportKind::NixlVram, want.clone()),
        (DeviceRoute::CudaIpc, TransportKind::CudaIpc, b"room-7".to_vec()),
    ];
    for (route, kind, bytes) in cases {
        let (pages, got) = fetch_device(reg.endpoint(), 7, 2, 3, route, sink(), T).await.expect("fetch");
        assert_eq!(got, kind, "{route:?}");
        assert_eq!(pages.len(), 3000, "{route:?}");
        assert_eq!(pages.get::<Vec<u8>>(), Some(&bytes), "{route:?}");
        // The provider gets its staging back once the copy is over (over TCP: the "done").
        let deadline = std::time::Instant::now() + T;
        while !freed.load(Ordering::SeqCst) {
            assert!(std::time::Instant::now() < deadline, "{route:?}: the staging was never freed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    // Typed failures: an unknown room, a provider without GPU pages, a copy past the deadline.
    let e = fetch_device(reg.endpoint(), 8, 0, 1, DeviceRoute::CudaIpc, sink(), T).await.expect_err("room");
    assert_eq!(e, TransferError::UnknownRoom(8));
    let host: Arc<dyn PageProvider> = Arc::new(Pattern);
    let host_reg = server.register(&host);
    let e =
        fetch_device(host_reg.endpoint(), 7, 0, 1, DeviceRoute::CudaIpc, sink(), T).await.expect_err("host");
    assert!(matches!(e, TransferError::Source(ref m) if m.contains("not in GPU memory")), "{e}");
    let slow = Arc::new(Sink { freed: freed.clone(), delay: Duration::from_millis(600) });
    let e = fetch_device(reg.endpoint(), 7, 0, 1, DeviceRoute::CudaIpc, slow, Duration::from_millis(200))
        .await
        .expect_err("slow copy");
    assert!(matches!(e, TransferError::Timeout { .. }), "{e}");
    // The server frees the abandoned staging (at the client's deadline at the latest).
    let deadline = std::time::Instant::now() + T;
    while !freed.load(Ordering::SeqCst) {
        assert!(std::time::Instant::now() < deadline, "the abandoned staging was never freed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // In process needs the provider here.
    let other = Endpoint { process: process_nonce() ^ 1, ..reg.endpoint().clone() };
    let e = fetch_device(&other, 7, 0, 1, DeviceRoute::InProcess, sink(), T).await.expect_err("elsewhere");
    assert!(matches!(e, TransferError::Protocol(_)), "{e}");
}
