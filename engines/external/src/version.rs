//! Which release of its engine an interpreter has, asked before the server starts. xinf's flag
//! tables and KV connectors are made for one release of each engine ([`Flavor::release`]):
//! the connectors reach into engine internals that change between releases, so a P/D replica
//! on another release is refused before anything starts, and an ordinary one starts with a
//! warning (its flags are still checked against the table). An interpreter without the engine
//! is refused in a moment, with what to do, instead of failing after the server's imports.

use crate::flavor::Flavor;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;
use xinf_engine::EngineError;

/// How long the interpreter may take to say (a cold start of Python on a busy machine).
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// What the probe prints at most: a version, or an interpreter's error.
const PROBE_BYTES: u64 = 4096;

/// Prints the version of the distribution named by its argument, or nothing when it is not
/// installed; it imports neither engine.
const PROBE: &str = "import importlib.metadata as m, sys\n\
                     try:\n    print(m.version(sys.argv[1]))\n\
                     except m.PackageNotFoundError:\n    print()\n";

/// Checks that `program` (with `env`) has the release of `flavor` a replica of it may run on:
/// for a P/D replica (`pd`) the one xinf's connectors are made for, else any, with a warning
/// for another.
pub(crate) fn check(
    flavor: Flavor,
    program: &str,
    env: &[(String, String)],
    pd: bool,
) -> Result<(), EngineError> {
    let found = installed(program, env, flavor.name())?;
    let wanted = flavor.release();
    let Some(found) = found else {
        return Err(EngineError::Model(format!(
            "`{program}` has no {name} package: install {engine} beside xinf (the engines page says how), \
             or name an interpreter that has it with engine_config.python or XINF_PYTHON",
            name = flavor.name(),
            engine = flavor.display(),
        )));
    };
    if same_release(&found, wanted) {
        return Ok(());
    }
    if pd {
        return Err(EngineError::Model(format!(
            "`{program}` has {name} {found}, and xinf's KV connector is made for {engine}, whose \
             internals it uses: install {engine} for a prefill or decode replica",
            name = flavor.name(),
            engine = flavor.display(),
        )));
    }
    tracing::warn!(
        engine = flavor.display(),
        %found,
        "xinf checks this engine's flags against another release; flags that release does not have are refused before it starts"
    );
    Ok(())
}

/// Whether an installed `version` is release `wanted`, a local label (`+cu130`) aside.
fn same_release(version: &str, wanted: &str) -> bool {
    version.split('+').next().unwrap_or(version) == wanted
}

/// The version of `package` that `program` imports, `None` when it has none.
fn installed(program: &str, env: &[(String, String)], package: &str) -> Result<Option<String>, EngineError> {
    let failed =
        |why: String| EngineError::Process(format!("asking `{program}` for its {package} version: {why}"));
    let mut child = Command::new(program)
        .args(["-c", PROBE, package])
        .envs(env.iter().cloned())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| failed(format!("it could not be started ({e})")))?;
    // Read on threads, bounded: a full pipe must not hold the interpreter, nor a chatty one
    // fill this process.
    let (out, err) = (read_bounded(child.stdout.take()), read_bounded(child.stderr.take()));
    let deadline = std::time::Instant::now() + PROBE_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(failed(format!("no answer within {} s", PROBE_TIMEOUT.as_secs())));
            }
            Err(e) => return Err(failed(format!("it could not be waited for ({e})"))),
        }
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    if !status.success() {
        let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
        return Err(failed(format!("it exited ({status}): {last}")));
    }
    let version = out.lines().last().unwrap_or("").trim();
    Ok((!version.is_empty()).then(|| version.to_owned()))
}

/// Reads at most [`PROBE_BYTES`] of `pipe` on a thread of its own.
fn read_bounded<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(p) = pipe {
            let _ = p.take(PROBE_BYTES).read_to_string(&mut text);
        }
        text
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_label_is_the_same_release() {
        assert!(same_release("0.26.0", "0.26.0"));
        assert!(same_release("0.26.0+cu130", "0.26.0"));
        assert!(!same_release("0.26.1", "0.26.0"));
        assert!(!same_release("0.5.1", "0.5.15"));
    }
}
