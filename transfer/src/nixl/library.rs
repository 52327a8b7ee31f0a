//! Loading the NIXL library at run time (see the parent module's doc for where it is looked
//! for and why it is loaded by full path before nixl-sys is called).

use crate::error::TransferError;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The C API library the nixl-sys stubs look up by soname.
const CAPI: &str = "libnixl_capi.so";
/// Python packages of the NIXL wheels, newest CUDA first.
const WHEEL_PACKAGES: [&str; 2] = ["nixl_cu13", "nixl_cu12"];
/// How long the Python lookup of the wheel may take.
const PYTHON_LOOKUP: Duration = Duration::from_secs(15);
/// What to do when NIXL cannot be loaded.
const HOW_TO_INSTALL: &str = "install the NIXL wheel of the driver's CUDA major version (pip \
     install nixl-cu13, or nixl-cu12 for a CUDA 12 driver) and set XINF_NIXL_LIB_DIR to its \
     .nixl_cu13.mesonpy.libs (.nixl_cu12.mesonpy.libs) folder";

/// Whether NIXL can be used in this process: loads `libnixl_capi.so` the first time (see the
/// parent module's doc for where it is looked for) and remembers the answer.
///
/// The error is [`TransferError::NixlUnavailable`], whose text says what to install; a server
/// asked to move pages over NIXL should refuse to start with it rather than fail each fetch.
pub fn available() -> Result<(), TransferError> {
    static LOADED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match LOADED.get_or_init(load) {
        Ok(_) => Ok(()),
        Err(e) => Err(TransferError::NixlUnavailable(e.clone())),
    }
}

/// Loads the library (once, from [`available`]) and checks that the stubs found it.
fn load() -> Result<PathBuf, String> {
    let mut tried = Vec::new();
    let mut loaded = None;
    if let Some(dir) = std::env::var_os("XINF_NIXL_LIB_DIR").filter(|d| !d.is_empty()) {
        let path = Path::new(&dir).join(CAPI);
        // An explicit folder that does not hold it is a configuration error, not a reason to
        // quietly pick some other copy.
        open_library(&path).map_err(|e| format!("XINF_NIXL_LIB_DIR: {e}; {HOW_TO_INSTALL}"))?;
        loaded = Some(path);
    }
    if loaded.is_none() {
        match open_library(Path::new(CAPI)) {
            Ok(()) => loaded = Some(PathBuf::from(CAPI)),
            Err(e) => tried.push(e),
        }
    }
    if loaded.is_none() {
        match wheel_lib_dir() {
            Ok(dir) => {
                let path = dir.join(CAPI);
                match open_library(&path) {
                    Ok(()) => loaded = Some(path),
                    Err(e) => tried.push(e),
                }
            }
            Err(e) => tried.push(e),
        }
    }
    let Some(path) = loaded else {
        return Err(format!("{CAPI} was not found ({}); {HOW_TO_INSTALL}", tried.join("; ")));
    };
    // The stubs' own dlopen: answered by the object loaded above, so this cannot abort.
    if nixl_sys::is_stub() {
        return Err(format!(
            "{} was loaded but the NIXL bindings still cannot reach it; {HOW_TO_INSTALL}",
            path.display()
        ));
    }
    tracing::info!(library = %path.display(), "NIXL loaded");
    Ok(path)
}

/// dlopens `path` (a file, or a bare soname for the linker's search) for the life of the
/// process, so that the stubs' dlopen by soname finds this copy.
fn open_library(path: &Path) -> Result<(), String> {
    use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
    if path.components().count() > 1 && !path.is_file() {
        return Err(format!("{} does not exist", path.display()));
    }
    // SAFETY: loading runs the library's initialisers. libnixl_capi.so and its dependencies
    // (libnixl, UCX from the same wheel) do no more there than set up their own globals, and
    // this happens once, before any NIXL function is called.
    let library = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map_err(|e| {
        match std::error::Error::source(&e) {
            Some(cause) => format!("{}: {e}: {cause}", path.display()),
            None => format!("{}: {e}", path.display()),
        }
    })?;
    // Never unloaded: the stubs keep raw function pointers into it.
    std::mem::forget(library);
    Ok(())
}

/// Where the NIXL wheel keeps its libraries, asked of Python (without importing NIXL).
fn wheel_lib_dir() -> Result<PathBuf, String> {
    let python = std::env::var("XINF_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = format!(
        "import importlib.util, os\n\
         for name in {WHEEL_PACKAGES:?}:\n    \
             spec = importlib.util.find_spec(name)\n    \
             if spec and spec.origin:\n        \
                 d = os.path.join(os.path.dirname(os.path.dirname(spec.origin)), '.' + name + '.mesonpy.libs')\n        \
                 if os.path.isfile(os.path.join(d, '{CAPI}')):\n            \
                     print(d)\n            \
                     break\n"
    );
    let mut child = std::process::Command::new(&python)
        .args(["-c", &script])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("{python} (to find the nixl-cu13 or nixl-cu12 wheel): {e}"))?;
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() < PYTHON_LOOKUP => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{python} did not answer within {PYTHON_LOOKUP:?}"));
            }
            Err(e) => return Err(format!("{python}: {e}")),
        }
    }
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        use std::io::Read;
        stdout.read_to_string(&mut out).map_err(|e| format!("{python}: {e}"))?;
    }
    match out.trim() {
        "" => Err(format!("{python} has neither the nixl-cu13 nor the nixl-cu12 package")),
        dir => Ok(PathBuf::from(dir)),
    }
}
