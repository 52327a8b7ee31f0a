#!/usr/bin/env python3
"""cuBLAS's default pick against every cublasLt algorithm it offers, for the native engine's
prompt-step products (Yᵀ[out, rows] = W[out, inp] · Xᵀ, f16 in and out, f32 compute).

python3 lt_algos.py [--shape l8b|q05] [--rows 8192,6612,946,2833] [--algos 16]
"""
import argparse, ctypes, glob, os, sys
import torch

def lib(name):
    cands = glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", name + "*"))
    cands += glob.glob("/usr/local/cuda/lib64/" + name + "*")
    for c in sorted(cands):
        try:
            return ctypes.CDLL(c)
        except OSError:
            pass
    sys.exit(f"no {name}")

blas = lib("libcublas.so")
lt = lib("libcublasLt.so")

R_16F, R_32F, COMPUTE_32F = 2, 0, 68
OP_N, OP_T = 0, 1

class Heur(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("ws", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]

def ok(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: status {rc}")

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="l8b")
    ap.add_argument("--rows", default="8192,6612,946,2833")
    ap.add_argument("--algos", type=int, default=16)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    prods = {
        "l8b": [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)],
        "q05": [("qkv", 1152, 896), ("o", 896, 896), ("gate_up", 9728, 896), ("down", 896, 4864)],
    }[a.shape]
    dev = torch.device("cuda")
    stream = torch.cuda.current_stream().cuda_stream
    handle = ctypes.c_void_p(torch.cuda.current_blas_handle())
    lth = ctypes.c_void_p()
    ok(lt.cublasLtCreate(ctypes.byref(lth)), "cublasLtCreate")
    ws_bytes = 32 << 20
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device=dev)
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
    print(f"{torch.cuda.get_device_name()}; µs a product, median of {a.reps}")
    for rows in [int(r) for r in a.rows.split(",")]:
        for name, out, inp in prods:
            w = torch.randn(out, inp, device=dev, dtype=torch.float16) * 0.02
            x = torch.randn(rows, inp, device=dev, dtype=torch.float16)
            y = torch.empty(rows, out, device=dev, dtype=torch.float16)
            flop = 2.0 * out * inp * rows

            def timed(fn):
                for _ in range(3):
                    fn()
                ts = []
                for _ in range(a.reps):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record(); fn(); e.record(); e.synchronize()
                    ts.append(s.elapsed_time(e) * 1e3)
                ts.sort()
                return ts[len(ts) // 2]

            def gemm_ex():
                ok(blas.cublasGemmEx(handle, OP_T, OP_N, out, rows, inp, ctypes.byref(alpha),
                                     ctypes.c_void_p(w.data_ptr()), R_16F, inp, ctypes.c_void_p(x.data_ptr()), R_16F,
                                     inp, ctypes.byref(beta), ctypes.c_void_p(y.data_ptr()), R_16F, out, COMPUTE_32F, -1),
                   "cublasGemmEx")
            base = timed(gemm_ex)
            ref = y.clone()

            desc = ctypes.c_void_p()
            ok(lt.cublasLtMatmulDescCreate(ctypes.byref(desc), COMPUTE_32F, R_32F), "desc")
            ta, tb = ctypes.c_int32(OP_T), ctypes.c_int32(OP_N)
            ok(lt.cublasLtMatmulDescSetAttribute(desc, 3, ctypes.byref(ta), 4), "transa")
            ok(lt.cublasLtMatmulDescSetAttribute(desc, 4, ctypes.byref(tb), 4), "transb")
            la, lb, lc = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
            ok(lt.cublasLtMatrixLayoutCreate(ctypes.byref(la), R_16F, ctypes.c_uint64(inp), ctypes.c_uint64(out), ctypes.c_int64(inp)), "la")
            ok(lt.cublasLtMatrixLayoutCreate(ctypes.byref(lb), R_16F, ctypes.c_uint64(inp), ctypes.c_uint64(rows), ctypes.c_int64(inp)), "lb")
            ok(lt.cublasLtMatrixLayoutCreate(ctypes.byref(lc), R_16F, ctypes.c_uint64(out), ctypes.c_uint64(rows), ctypes.c_int64(out)), "lc")
            pref = ctypes.c_void_p()
            ok(lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "pref")
            wsz = ctypes.c_uint64(ws_bytes)
            ok(lt.cublasLtMatmulPreferenceSetAttribute(pref, 1, ctypes.byref(wsz), 8), "pref ws")
            res = (Heur * a.algos)()
            n = ctypes.c_int()
            ok(lt.cublasLtMatmulAlgoGetHeuristic(lth, desc, la, lb, lc, lc, pref, a.algos, res, ctypes.byref(n)), "heuristic")
            times = []
            for i in range(n.value):
                h = res[i]
                if h.state != 0:
                    continue

                def run(h=h):
                    ok(lt.cublasLtMatmul(lth, desc, ctypes.byref(alpha), ctypes.c_void_p(w.data_ptr()), la,
                                         ctypes.c_void_p(x.data_ptr()), lb, ctypes.byref(beta),
                                         ctypes.c_void_p(y.data_ptr()), lc, ctypes.c_void_p(y.data_ptr()), lc,
                                         ctypes.byref(h.algo), ctypes.c_void_p(ws.data_ptr()), ctypes.c_size_t(ws_bytes),
                                         ctypes.c_void_p(stream)), "matmul")
                try:
                    t = timed(run)
                except RuntimeError as e:
                    print(f"  algo {i}: {e}")
                    continue
                err = (y.float() - ref.float()).abs().max().item()
                times.append((t, i, err))
            best = min(times)
            first = [t for t in times if t[1] == 0]
            f0 = first[0][0] if first else float("nan")
            print(f"rows {rows:5d} {name:8s} {out:6d}x{inp:6d}: GemmEx {base:8.1f} ({flop / base / 1e6:5.0f} TF/s)  "
                  f"Lt#0 {f0:8.1f}  best Lt#{best[1]:2d} {best[0]:8.1f} ({flop / best[0] / 1e6:5.0f} TF/s, "
                  f"{best[0] / base:.3f}x, max diff {best[2]:.2e}) of {len(times)}")
            for o in (la, lb, lc):
                lt.cublasLtMatrixLayoutDestroy(o)
            lt.cublasLtMatmulPreferenceDestroy(pref)
            lt.cublasLtMatmulDescDestroy(desc)

main()
