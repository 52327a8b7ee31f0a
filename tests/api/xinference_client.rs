//! Xinference's own Python client (`xinference_client`, from PyPI) against `xinf local` with an
//! API key: `tests/xinference_client/client_e2e.py` drives every call of the client that xinf
//! serves and checks the answers and the server's error messages.

use crate::util::{self, procs};
use std::process::Command;

const KEY: &str = "sk-xinference-client";

#[test]
fn xinference_python_client_drives_a_local_cluster() {
    let python = util::python();
    let has_client =
        Command::new(&python).args(["-c", "import xinference_client"]).status().is_ok_and(|s| s.success());
    assert!(
        has_client,
        "`{python}` cannot import xinference_client; run scripts/test.sh, which installs it, or \
         `{python} -m pip install xinference-client`"
    );
    let _ = util::smollm2(); // fetched once, before the server waits on it
    let (server, addr) = procs::local("preloaded", &["--api-key", KEY]);
    let url = format!("http://{addr}");
    let out = util::client_script(&["tests/xinference_client/client_e2e.py", &url, KEY, "preloaded"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the Xinference client failed:\n{stdout}\n{stderr}\nxinf's log:\n{}",
        server.log()
    );
    for step in ["api key refused", "prefill/decode launch", "abort_request", "terminate_model"] {
        assert!(stdout.contains(&format!("ok {step}")), "no `ok {step}`:\n{stdout}\n{stderr}");
    }
}
