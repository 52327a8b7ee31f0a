//! GPU-to-GPU handoffs of a prompt's canonical pages, checked bit for bit against the CPU
//! reference and timed: a Qwen2.5-0.5B-shaped FP16 cache (24 layers, 2 KV heads, head dim 64),
//! a 1,024-token prompt (16 pages, 12.6 MB), gathered out of a vLLM FlashAttention HND cache
//! (B=16), moved to the decode side and scattered into an SGLang token pool (B=1).
//!
//! - CUDA IPC: the decode side is a second process, this test binary run again on
//!   `transport::gpu_ipc_child` with the handle in `XINF_GPU_IPC_CHILD` (a process cannot open
//!   its own handle); the two talk over the child's stdin/stdout. The decode process runs on
//!   GPU 0 as the prefill does, or on GPU 1 (`gpu_handoff_over_cuda_ipc_between_gpus`: one GPU
//!   a role, the handle opened with peer access), timed against a peer copy of the same bytes
//!   between the two GPUs; with one GPU that test says SKIPPED.
//! - NIXL VRAM: two agents in this process. Without NIXL, or without GPU support in its UCX
//!   backend, the test says SKIPPED and why, unless `XINF_TEST_NIXL=1` asks for it.
//!
//! Timings are medians of 20 repetitions after a warm-up, printed with `eprintln!` (run with
//! `--nocapture --test-threads=1`); nothing is asserted about speed.

use super::{bytes, cache, gpu, words};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use std::io::{BufRead, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};
use xinf_test_util::Rng;
use xinf_transfer::gpu::GpuPages;
use xinf_transfer::gpu_ipc::{DeviceBuffer, IpcHandle, IpcMapping};
use xinf_transfer::nixl::{RemoteVram, VramAgent};
use xinf_transfer::transport::TransferError;
use xinf_transfer::{Direction, KvLayout, KvLayoutKind, KvOrder, LayoutDescriptor, PAGE_TOKENS, copy_pages};

const LAYERS: usize = 24;
const HEADS: usize = 2;
const DIM: usize = 64;
const LEN: usize = 1024;
const REPS: usize = 20;
/// The child's handle (hex); its presence makes `gpu_ipc_child` the decode process.
const CHILD_ENV: &str = "XINF_GPU_IPC_CHILD";
/// Marks the child's protocol lines among libtest's own output.
const MARK: &str = "XINF-IPC ";
/// The decode process's GPU (an ordinal; 0 without it).
const CHILD_GPU_ENV: &str = "XINF_GPU_IPC_CHILD_GPU";
/// How long the parent waits for any answer of the child.
const CHILD_WAIT: Duration = Duration::from_secs(120);

/// Both ends of the handoff on the host, the same in both processes: the prefill cache
/// (random values), the decode pool (poison), and the CPU reference of the pages and of the
/// pool after the scatter.
struct Fixture {
    sdesc: LayoutDescriptor,
    sregions: Vec<Vec<u16>>,
    stable: Vec<u32>,
    ddesc: LayoutDescriptor,
    dregions: Vec<Vec<u16>>,
    dtable: Vec<u32>,
    pages: Vec<u16>,
    expected: Vec<Vec<u16>>,
    count: usize,
}

impl Fixture {
    fn new() -> Self {
        let fa_hnd = KvLayout { kind: KvLayoutKind::PagedKvFirst, order: KvOrder::Hnd, block_size: 16 };
        let pool = KvLayout { kind: KvLayoutKind::TokenPool, order: KvOrder::Nhd, block_size: 1 };
        let (sdesc, mut sregions, stable) = cache(fa_hnd, LAYERS, HEADS, DIM, LEN, LEN / 16 + 9, 11);
        let mut x = Rng::new(0x5eed_0fca_fe00_u64);
        for r in &mut sregions {
            for w in r.iter_mut() {
                *w = (x.next_u64() & 0xffff) as u16;
            }
        }
        let count = LEN.div_ceil(PAGE_TOKENS);
        let mut pages = vec![0u16; count * 2 * LAYERS * PAGE_TOKENS * HEADS * DIM];
        {
            let mut views: Vec<&mut [u16]> = sregions.iter_mut().map(|r| r.as_mut_slice()).collect();
            copy_pages(Direction::Gather, &sdesc, &mut views, &stable, LEN, 0..count, &mut pages);
        }
        let (ddesc, dregions, dtable) = cache(pool, LAYERS, HEADS, DIM, LEN, LEN + 33, 12);
        let mut expected = dregions.clone();
        {
            let mut views: Vec<&mut [u16]> = expected.iter_mut().map(|r| r.as_mut_slice()).collect();
            copy_pages(Direction::Scatter, &ddesc, &mut views, &dtable, LEN, 0..count, &mut pages);
        }
        Self { sdesc, sregions, stable, ddesc, dregions, dtable, pages, expected, count }
    }

    /// Bytes of the pages moved.
    fn moved(&self) -> usize {
        self.pages.len() * 2
    }
}

fn upload(stream: &Arc<CudaStream>, regions: &[Vec<u16>]) -> Vec<CudaSlice<u8>> {
    regions.iter().map(|r| stream.clone_htod(&bytes(r)).expect("upload")).collect()
}

/// The first region of `dev` that differs from `want`, if any.
fn first_difference(stream: &Arc<CudaStream>, dev: &[CudaSlice<u8>], want: &[Vec<u16>]) -> Option<usize> {
    (dev.iter().zip(want)).position(|(d, w)| words(&stream.clone_dtoh(d).expect("download")) != *w)
}

/// FNV-1a, to compare the moved bytes across the two processes.
fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// One warm-up, then the median of `REPS` timed runs of `f` (seconds).
fn time(mut f: impl FnMut()) -> f64 {
    f();
    median(
        (0..REPS)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

/// A device-to-device copy of `n` bytes between two buffers, for reference (seconds).
fn memcpy_time(stream: &Arc<CudaStream>, n: usize) -> f64 {
    let a = stream.alloc_zeros::<u8>(n).expect("alloc");
    let mut b = stream.alloc_zeros::<u8>(n).expect("alloc");
    time(|| {
        stream.memcpy_dtod(&a, &mut b).expect("memcpy");
        stream.synchronize().expect("sync");
    })
}

fn us(s: f64) -> String {
    format!("{:.1} µs", s * 1e6)
}

fn gbs(n: usize, s: f64) -> String {
    format!("{:.1} GB/s", n as f64 / s / 1e9)
}

/// The prefill side's part, common to both paths: the cache on the GPU, and a gather into
/// `staging` checked against the CPU.
fn gather_checked(g: &GpuPages, f: &Fixture, src: &[CudaSlice<u8>], staging: &mut CudaSlice<u8>) {
    g.gather(&f.sdesc, 2, src, &f.stable, LEN, 0..f.count, staging).expect("gather");
    g.synchronize().expect("sync");
    let got = g.stream().clone_dtoh(&*staging).expect("download");
    assert!(words(&got[..f.moved()]) == f.pages, "the GPU gather differs from the CPU's");
}

// ---------------------------------------------------------------------------------------------
// CUDA IPC

/// The decode process: its stdin, and its protocol lines.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Peer {
    fn spawn(handle: &IpcHandle, gpu: usize) -> Self {
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut child = Command::new(exe)
            .args(["--exact", "transport::gpu_ipc_child", "--ignored", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, handle.to_hex())
            .env(CHILD_GPU_ENV, gpu.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting the decode process");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // libtest may print on the same line ("test … ... XINF-IPC ready").
                if let Some(at) = line.find(MARK)
                    && tx.send(line[at + MARK.len()..].trim().to_owned()).is_err()
                {
                    break;
                }
            }
        });
        Self { child, stdin, lines }
    }

    fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}")
            .and_then(|()| self.stdin.flush())
            .expect("writing to the decode process");
    }

    /// The next protocol line, which must start with `word`.
    fn expect(&mut self, word: &str) -> String {
        match self.lines.recv_timeout(CHILD_WAIT) {
            Ok(line) if line.split_whitespace().next() == Some(word) => line,
            Ok(line) => panic!("the decode process answered {line:?}, not {word}"),
            Err(RecvTimeoutError::Timeout) => panic!("no {word} from the decode process in {CHILD_WAIT:?}"),
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait();
                panic!("the decode process ended before {word}: {status:?} (its stderr is above)")
            }
        }
    }

    /// Asks for a check and asserts it: the pool matches the CPU and the moved bytes are `sum`.
    fn check(&mut self, sum: u64) {
        self.send("check");
        let line = self.expect("checked");
        assert_eq!(line, format!("checked {sum:016x} ok"), "the decode process's check");
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The handoff over CUDA IPC into a second process on the same GPU: see [`ipc_handoff`].
#[test]
fn gpu_handoff_over_cuda_ipc() {
    let Some(g) = gpu() else { return };
    let stream = g.stream().clone();
    ipc_handoff(&g, 0, |n| {
        format!("device-to-device memcpy on GPU 0 {}", timed_copy(n, memcpy_time(&stream, n)))
    });
}

/// The handoff over CUDA IPC into a decode process on GPU 1, the prefill on GPU 0, as P/D with
/// one GPU a role runs it: see [`ipc_handoff`]; the reference is a peer copy GPU 0 → GPU 1.
#[test]
fn gpu_handoff_over_cuda_ipc_between_gpus() {
    let Some(g) = gpu() else { return };
    let count = CudaContext::device_count().expect("counting GPUs");
    if count < 2 {
        eprintln!("SKIPPED gpu_handoff_over_cuda_ipc_between_gpus: {count} GPU here, it needs two");
        return;
    }
    ipc_handoff(&g, 1, |n| format!("peer copy GPU 0 → GPU 1 {}", timed_copy(n, peer_copy_time(&g, 1, n))));
}

fn timed_copy(n: usize, s: f64) -> String {
    format!("{} = {}", us(s), gbs(n, s))
}

/// A peer copy of `n` bytes from GPU `g`'s to a buffer on GPU `to` (seconds): the driver's own
/// path between the two GPUs (NVLink, PCIe peer to peer, or through the host where neither).
fn peer_copy_time(g: &GpuPages, to: usize, n: usize) -> f64 {
    let src = g.stream().alloc_zeros::<u8>(n).expect("alloc");
    let other = CudaContext::new(to).expect("the second GPU");
    let dst_stream = other.default_stream();
    let dst = dst_stream.alloc_zeros::<u8>(n).expect("alloc on the second GPU");
    let stream = g.stream().clone();
    let (src_ptr, _s) = src.device_ptr(&stream);
    let (dst_ptr, _d) = dst.device_ptr(&dst_stream);
    dst_stream.synchronize().expect("sync");
    time(|| {
        // The copy goes on GPU `g`'s stream, so its context is the thread's.
        g.context().bind_to_thread().expect("binding GPU 0");
        // SAFETY: both buffers are alive for the whole call (held above) and `n` bytes long;
        // the copy is waited for before the next one or the buffers' drop.
        #[allow(unsafe_code)]
        unsafe {
            cudarc::driver::result::memcpy_peer_async(
                other.cu_ctx(),
                dst_ptr,
                g.context().cu_ctx(),
                src_ptr,
                n,
                stream.cu_stream(),
            )
        }
        .expect("peer copy");
        stream.synchronize().expect("sync");
    })
}

/// The handoff over CUDA IPC into a second process on GPU `child_gpu`: the pages gathered here
/// into an exported buffer, copied device to device by the decode process and scattered into
/// its token pool, checked bit for bit there (against the same CPU reference) before and after
/// the timed runs. `reference` times a plain copy of the same bytes, once the decode process
/// is gone, and says how long it took.
fn ipc_handoff(g: &GpuPages, child_gpu: usize, reference: impl FnOnce(usize) -> String) {
    let stream = g.stream().clone();
    let f = Fixture::new();
    let n = f.moved();
    let src = upload(&stream, &f.sregions);
    let mut staging = DeviceBuffer::zeroed(&stream, n).expect("staging buffer");
    gather_checked(g, &f, &src, staging.slice_mut());
    let handle = staging.export_ipc(0..n).expect("exporting the staging buffer");
    assert_eq!(IpcHandle::from_hex(&handle.to_hex()).expect("hex"), handle);
    let sum = fnv(&bytes(&f.pages));

    let mut peer = Peer::spawn(&handle, child_gpu);
    peer.expect("ready");
    peer.check(sum);

    let gather = time(|| {
        g.gather(&f.sdesc, 2, &src, &f.stable, LEN, 0..f.count, staging.slice_mut()).expect("gather");
        g.synchronize().expect("sync");
    });
    let (mut handoffs, mut moves, mut move_scatters) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..=REPS {
        let t = Instant::now();
        g.gather(&f.sdesc, 2, &src, &f.stable, LEN, 0..f.count, staging.slice_mut()).expect("gather");
        g.synchronize().expect("sync");
        peer.send("go");
        let line = peer.expect("done");
        let elapsed = t.elapsed().as_secs_f64();
        let ns: Vec<f64> = line.split_whitespace().skip(1).map(|v| v.parse().expect("a time")).collect();
        assert_eq!(ns.len(), 2, "done <move ns> <move+scatter ns>: {line}");
        if rep > 0 {
            handoffs.push(elapsed);
            moves.push(ns[0] / 1e9);
            move_scatters.push(ns[1] / 1e9);
        }
    }
    peer.check(sum);
    drop(peer);
    let (handoff, moved, move_scatter) = (median(handoffs), median(moves), median(move_scatters));
    eprintln!(
        "CUDA IPC handoff, {:.1} MB ({} pages, {LEN} tokens, Qwen2.5-0.5B shape, FP16, FA-HND-16 → token pool, \
         two processes, the decode one on GPU {child_gpu}), median of {REPS}: handoff (gather + sync, signal, \
         copy + scatter + sync in the decode process, reply) {} = {}; move alone (cuMemcpyDtoDAsync from the \
         mapped handle + sync) {} = {}; move + scatter {}; gather {}; {}",
        n as f64 / 1e6,
        f.count,
        us(handoff),
        gbs(n, handoff),
        us(moved),
        gbs(n, moved),
        us(move_scatter),
        us(gather),
        reference(n),
    );
}

/// The decode process of [`gpu_handoff_over_cuda_ipc`]: maps the handle, then answers its
/// commands on stdin (`go`: copy and scatter, reply the times; `check`: compare with the CPU;
/// `quit`). Run by that test only.
#[test]
#[ignore = "the decode process of gpu_handoff_over_cuda_ipc, which runs it"]
fn gpu_ipc_child() {
    let Ok(hex) = std::env::var(CHILD_ENV) else {
        eprintln!("SKIPPED: gpu_ipc_child is the decode process of gpu_handoff_over_cuda_ipc, started by it");
        return;
    };
    let say = |line: &str| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "\n{MARK}{line}").and_then(|()| out.flush()).expect("stdout");
    };
    let handle = IpcHandle::from_hex(&hex).expect("the handle");
    let ordinal = std::env::var(CHILD_GPU_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let g = GpuPages::new(ordinal).expect("the GPU in the decode process");
    let stream = g.stream().clone();
    let mapping = IpcMapping::open(g.context(), &handle).expect("opening the handle");
    let f = Fixture::new();
    let n = mapping.len();
    assert_eq!(n, f.moved(), "the handle's range");
    let mut received = stream.alloc_zeros::<u8>(n).expect("alloc");
    let mut pool = upload(&stream, &f.dregions);
    say("ready");
    for line in std::io::stdin().lock().lines() {
        let line = line.expect("stdin");
        match line.trim() {
            "go" => {
                let t = Instant::now();
                mapping.copy_into(&stream, 0..n, &mut received).expect("copy from the peer");
                let moved = t.elapsed();
                g.scatter(&f.ddesc, 2, &mut pool, &f.dtable, LEN, 0..f.count, &received).expect("scatter");
                g.synchronize().expect("sync");
                let total = t.elapsed();
                say(&format!("done {} {}", moved.as_nanos(), total.as_nanos()));
            }
            "check" => {
                // Poison again, then one more handoff, checked as a whole.
                pool = upload(&stream, &f.dregions);
                mapping.copy_into(&stream, 0..n, &mut received).expect("copy from the peer");
                g.scatter(&f.ddesc, 2, &mut pool, &f.dtable, LEN, 0..f.count, &received).expect("scatter");
                g.synchronize().expect("sync");
                let sum = fnv(&stream.clone_dtoh(&received).expect("download"));
                let verdict = match first_difference(&stream, &pool, &f.expected) {
                    None => "ok".to_owned(),
                    Some(i) => format!("mismatch-in-region-{i}"),
                };
                say(&format!("checked {sum:016x} {verdict}"));
            }
            "quit" => return,
            other => panic!("unknown command {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// NIXL VRAM

/// The handoff over NIXL between two agents of this process, VRAM to VRAM: the pages gathered
/// into a buffer registered with the prefill agent, read by the decode agent into its own
/// registered buffer, scattered into the token pool; checked bit for bit before and after the
/// timed runs.
#[test]
fn gpu_handoff_over_nixl_vram() {
    let Some(g) = gpu() else { return };
    let required = std::env::var("XINF_TEST_NIXL").ok().as_deref() == Some("1");
    // What cannot be set up is a SKIPPED line unless NIXL is required; wrong bytes always fail.
    let unavailable = |what: &str, e: TransferError| {
        if required {
            panic!("XINF_TEST_NIXL=1 but {what}: {e}");
        }
        eprintln!(
            "SKIPPED: NIXL VRAM handoff: {what}: {e} (set XINF_NIXL_LIB_DIR to the nixl-cu12 libraries; \
             UCX_LOG_LEVEL=info shows which UCX transports load; XINF_TEST_NIXL=1 makes this a failure)"
        );
    };
    let stream = g.stream().clone();
    let ctx = g.context().clone();
    let pid = std::process::id();
    let agents = VramAgent::new(&format!("xinf-gpu-prefill-{pid}"), &ctx)
        .and_then(|p| Ok((p, VramAgent::new(&format!("xinf-gpu-decode-{pid}"), &ctx)?)));
    let (prefill, decode) = match agents {
        Ok(agents) => agents,
        Err(e) => return unavailable("creating the agents", e),
    };
    let f = Fixture::new();
    let n = f.moved();
    let src = upload(&stream, &f.sregions);
    let registered = prefill
        .register(DeviceBuffer::zeroed(&stream, n).expect("staging buffer"))
        .and_then(|s| Ok((s, decode.register(DeviceBuffer::zeroed(&stream, n).expect("receive buffer"))?)));
    let (mut staging, mut received) = match registered {
        Ok(regions) => regions,
        Err(e) => return unavailable("registering GPU memory", e),
    };
    // What the prefill side would send on its control channel, through the wire format.
    let remote = prefill.remote(&staging, 0..n).expect("the staged range");
    let remote = RemoteVram::decode(&remote.encode()).expect("decoding the range");
    let deadline = || Instant::now() + Duration::from_secs(30);

    gather_checked(&g, &f, &src, staging.slice_mut());
    if let Err(e) = decode.read(&remote, &mut received, deadline()) {
        return unavailable("the first NIXL read of GPU memory", e);
    }
    let got = stream.clone_dtoh(received.buffer().slice()).expect("download");
    assert!(words(&got) == f.pages, "the pages read over NIXL differ from the CPU's");
    let mut pool = upload(&stream, &f.dregions);
    g.scatter(&f.ddesc, 2, &mut pool, &f.dtable, LEN, 0..f.count, received.buffer().slice())
        .expect("scatter");
    g.synchronize().expect("sync");
    assert_eq!(first_difference(&stream, &pool, &f.expected), None, "the token pool after the NIXL handoff");

    let gather = time(|| {
        g.gather(&f.sdesc, 2, &src, &f.stable, LEN, 0..f.count, staging.slice_mut()).expect("gather");
        g.synchronize().expect("sync");
    });
    let moved = time(|| decode.read(&remote, &mut received, deadline()).expect("NIXL read"));
    let scatter = time(|| {
        g.scatter(&f.ddesc, 2, &mut pool, &f.dtable, LEN, 0..f.count, received.buffer().slice())
            .expect("scatter");
        g.synchronize().expect("sync");
    });
    let handoff = time(|| {
        g.gather(&f.sdesc, 2, &src, &f.stable, LEN, 0..f.count, staging.slice_mut()).expect("gather");
        g.synchronize().expect("sync");
        decode.read(&remote, &mut received, deadline()).expect("NIXL read");
        g.scatter(&f.ddesc, 2, &mut pool, &f.dtable, LEN, 0..f.count, received.buffer().slice())
            .expect("scatter");
        g.synchronize().expect("sync");
    });
    // Still bit-exact after the timed runs, from a poisoned pool.
    let mut pool = upload(&stream, &f.dregions);
    decode.read(&remote, &mut received, deadline()).expect("NIXL read");
    g.scatter(&f.ddesc, 2, &mut pool, &f.dtable, LEN, 0..f.count, received.buffer().slice())
        .expect("scatter");
    g.synchronize().expect("sync");
    assert_eq!(first_difference(&stream, &pool, &f.expected), None, "the token pool after the timed runs");
    let memcpy = memcpy_time(&stream, n);
    eprintln!(
        "NIXL VRAM handoff, {:.1} MB ({} pages, {LEN} tokens, Qwen2.5-0.5B shape, FP16, FA-HND-16 → token pool, \
         two agents in one process), median of {REPS}: handoff (gather + sync, NIXL read, scatter + sync) {} = {}; \
         move alone (one NIXL READ, VRAM to VRAM, posted and polled) {} = {}; gather {}; scatter {}; \
         device-to-device memcpy of the same bytes {} = {}",
        n as f64 / 1e6,
        f.count,
        us(handoff),
        gbs(n, handoff),
        us(moved),
        gbs(n, moved),
        us(gather),
        us(scatter),
        us(memcpy),
        gbs(n, memcpy),
    );
}
