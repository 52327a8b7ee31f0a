//! The Web UI in headless Chromium (Debian's `chromium` and `chromium-driver`, driven by
//! Selenium from PyPI): `tests/web_ui/ui_e2e.py` lists the running models, launches a P/D model
//! through the form (a refused option shown at the replica's field first), chats with it and
//! sees the streamed answer, sees the handoff counters move, adds a decode replica and removes
//! it, and terminates it; then the page
//! in a browser that asks for Japanese is in Japanese. Screenshots go to `$XINF_UI_SCREENSHOTS`
//! (default: the test scratch directory).

use crate::util::{self, procs};
use std::process::Command;

#[test]
fn the_web_ui_launches_chats_and_terminates_in_chromium() {
    let python = util::python();
    let ready = Command::new(&python).args(["-c", "import selenium"]).status().is_ok_and(|s| s.success())
        && std::path::Path::new("/usr/bin/chromium").is_file()
        && std::path::Path::new("/usr/bin/chromedriver").is_file();
    assert!(
        ready,
        "the Web UI test needs /usr/bin/chromium, /usr/bin/chromedriver and selenium in `{python}`; run \
         scripts/test.sh, which installs them"
    );
    let _ = util::smollm2();
    let (server, addr) = procs::local("preloaded", &[]);
    let shots = std::env::var_os("XINF_UI_SCREENSHOTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| util::scratch().join("ui-screenshots"));
    std::fs::create_dir_all(&shots).expect("screenshot directory");
    let url = format!("http://{addr}");
    let out = util::client_script(&["tests/web_ui/ui_e2e.py", &url, &shots.to_string_lossy(), "preloaded"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the Web UI failed in Chromium (screenshots in {}):\n{stdout}\n{stderr}\nxinf's log:\n{}",
        shots.display(),
        server.log()
    );
    for step in [
        "models listed",
        "refusal shown by field",
        "launch key refusal shown",
        "prefill/decode launch",
        "chat answered",
        "handoff counters",
        "replica added",
        "replica removed",
        "terminate",
        "the page in Japanese",
    ] {
        assert!(stdout.contains(&format!("ok {step}")), "no `ok {step}`:\n{stdout}\n{stderr}");
    }
}
