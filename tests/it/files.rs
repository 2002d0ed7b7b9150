//! Files in and out of a run: inputs the code reads, files it produces, the budgets that keep
//! the host's disk safe, bad input names, and escape attempts through the scratch directory.
//! On every backend that places files (wasm, wasm+bubblewrap and bubblewrap's one-shot runs);
//! the other native backends refuse input files with a typed error.

use crate::common;
use crate::os_support;

use common::assert_kind;
use os_support::Subject;
use pycage::{ErrorKind, InputFile, Limits, RunRequest, ToolPolicy};
use pycage_tools::ToolRegistry;
use serde_json::json;

fn runner(s: &Subject) -> pycage::Runner {
    s.runner(ToolRegistry::new(), ToolPolicy::new(), Limits::default())
}

fn paths(r: &pycage::RunResult) -> Vec<&str> {
    r.files.iter().map(|f| f.path.as_str()).collect()
}

fn bytes<'a>(r: &'a pycage::RunResult, path: &str) -> Option<&'a [u8]> {
    r.files
        .iter()
        .find(|f| f.path == path)
        .and_then(|f| f.bytes.as_deref())
}

async fn inputs_are_read_and_produced_files_return(s: &Subject) {
    let request = RunRequest::new(
        "import csv, os\n\
         rows = list(csv.reader(open('data.csv')))\n\
         open('out.txt', 'w').write(str(len(rows)))\n\
         os.makedirs('sub', exist_ok=True)\n\
         open('sub/x.bin', 'wb').write(bytes(range(256)))\n\
         open('dir/in.txt', 'a').write(' + more')\n\
         return [rows, open('/work/dir/in.txt').read(), sorted(os.listdir('.'))]",
    )
    .file(InputFile::new("data.csv", b"a,b\n1,2\n".to_vec()))
    .file(InputFile::new("dir/in.txt", b"given".to_vec()));
    let r = runner(s).run_request(request).await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(
        r.value,
        json!([
            [["a", "b"], ["1", "2"]],
            "given + more",
            ["data.csv", "dir", "out.txt", "sub"]
        ])
    );
    // The unchanged input does not come back; the changed one and the new ones do.
    assert_eq!(paths(&r), ["dir/in.txt", "out.txt", "sub/x.bin"]);
    assert_eq!(bytes(&r, "out.txt"), Some(&b"2"[..]));
    assert_eq!(bytes(&r, "dir/in.txt"), Some(&b"given + more"[..]));
    assert_eq!(bytes(&r, "sub/x.bin").unwrap().len(), 256);

    // With no inputs, the code can still write files and get them back.
    let r = runner(s)
        .run("open('made.txt', 'w').write('from nothing')")
        .await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(paths(&r), ["made.txt"]);
    // A run that touches no file produces none.
    let r = runner(s).run("return 1").await;
    assert!(r.files.is_empty());
}

/// The errno names of what the guest saw.
const ERRNO: &str =
    "import errno, os\ndef name(e):\n    return errno.errorcode.get(e.errno, str(e.errno))\n";

async fn run_limited(s: &Subject, code: &str, limits: Limits) -> pycage::RunResult {
    let r = runner(s)
        .run_request(RunRequest::new(format!("{ERRNO}{code}")).limits(limits))
        .await;
    assert!(r.ok, "the run goes on after a refused write: {r:#?}");
    r
}

async fn budgets_give_oserror_and_the_run_goes_on(s: &Subject) {
    // One file past max_file_bytes. A write through a file's stream reaches the guest as
    // EIO (WASI's libc says nothing else for a failed stream write); the run's stderr says
    // why, with the limit.
    let limits = Limits::builder().max_file_bytes(600).build().unwrap();
    let r = run_limited(
        s,
        "fd = os.open('big.bin', os.O_WRONLY | os.O_CREAT)\n\
         try:\n    os.write(fd, b'x' * 700)\n    seen = 'written'\n\
         except OSError as e:\n    seen = name(e)\n\
         os.write(fd, b'y' * 600)\n\
         return seen",
        limits,
    )
    .await;
    assert_eq!(r.value, json!("EIO"), "{r:#?}");
    assert!(
        r.stderr.contains(
            "[pycage: 1 file write(s) refused: a file would have grown past max_file_bytes (600)]"
        ),
        "{}",
        r.stderr
    );
    assert_eq!(r.files[0].size, 600);

    // The bytes written, over the directory's life: 10 writes of 100 fill 1,000; the 11th
    // is refused, and so is opening another file to write (with its own errno: ENOSPC).
    let limits = Limits::builder().max_written_bytes(1_000).build().unwrap();
    let r = run_limited(
        s,
        "fd = os.open('w.bin', os.O_WRONLY | os.O_CREAT)\n\
         n = 0\n\
         try:\n    while n < 100:\n        os.write(fd, b'z' * 100)\n        n += 1\n\
         except OSError as e:\n    seen = [name(e), n]\n\
         try:\n    open('more.txt', 'w')\n\
         except OSError as e:\n    seen.append(name(e))\n\
         return seen",
        limits,
    )
    .await;
    assert_eq!(r.value, json!(["EIO", 10, "ENOSPC"]), "{r:#?}");
    assert!(r.stderr.contains("max_written_bytes 1000"), "{}", r.stderr);
    let on_disk: u64 = r.files.iter().map(|f| f.size).sum();
    assert_eq!(
        on_disk, 1_000,
        "the host's disk holds what the budget allowed"
    );

    // Entries: three files and directories in all.
    let limits = Limits::builder().max_files(3).build().unwrap();
    let r = run_limited(
        s,
        "n = 0\n\
         try:\n    while n < 100:\n        open('f%d' % n, 'w').close()\n        n += 1\n\
         except OSError as e:\n    seen = [name(e), n]\n\
         try:\n    os.mkdir('d')\n\
         except OSError as e:\n    seen.append(name(e))\n\
         return seen",
        limits,
    )
    .await;
    assert_eq!(r.value, json!(["ENOSPC", 3, "ENOSPC"]), "{r:#?}");
    assert_eq!(r.files.len(), 3);
}

/// The budgets of a native guest's working directory (bubblewrap), where the kernel enforces
/// them: a tmpfs of the inputs plus `max_written_bytes` (the kernel counts whole pages), one
/// file past `max_file_bytes` is `EFBIG` (`RLIMIT_FSIZE`), and `max_files` is a count on the
/// way out that says so.
async fn native_budgets_give_oserror_and_the_run_goes_on(s: &Subject) {
    // One file past max_file_bytes: the write that crosses it is cut at the limit, the next
    // one is EFBIG.
    let limits = Limits::builder().max_file_bytes(600).build().unwrap();
    let r = run_limited(
        s,
        "fd = os.open('big.bin', os.O_WRONLY | os.O_CREAT)\n\
         first = os.write(fd, b'x' * 700)\n\
         try:\n    os.write(fd, b'y' * 600)\n    seen = 'written'\n\
         except OSError as e:\n    seen = name(e)\n\
         return [first, seen]",
        limits,
    )
    .await;
    assert_eq!(r.value, json!([600, "EFBIG"]), "{r:#?}");
    assert_eq!(r.files[0].size, 600);

    // The bytes written: past the tmpfs's size, ENOSPC, for a stream write and for a new
    // file's first byte alike; the host held no more than the size.
    let budget: u64 = 64 << 10;
    let input = InputFile::new("in.bin", vec![b'i'; 10_000]);
    let limits = Limits::builder().max_written_bytes(budget).build().unwrap();
    let r = runner(s)
        .run_request(
            RunRequest::new(format!(
                "{ERRNO}fd = os.open('w.bin', os.O_WRONLY | os.O_CREAT)\n\
                 n = 0\n\
                 try:\n    while n < 10_000:\n        os.write(fd, b'z' * 1000)\n        n += 1\n\
                 except OSError as e:\n    seen = [name(e), n]\n\
                 try:\n    open('more.txt', 'w').write('m')\n\
                 except OSError as e:\n    seen.append(name(e))\n\
                 return seen"
            ))
            .file(input)
            .limits(limits),
        )
        .await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.value[0], json!("ENOSPC"), "{r:#?}");
    // The kernel counts whole pages, approximately (per-CPU counters): within a few pages
    // of the budget (measured here: 66,000 bytes written of 65,536 with a 10,000-byte input).
    let slack = 8 * 4096;
    let written = r.value[1].as_u64().unwrap() * 1000;
    assert!(
        written <= budget + slack && written + slack >= budget,
        "{written} of {budget}"
    );
    let held: u64 = r.files.iter().map(|f| f.size).sum();
    assert!(
        held <= budget + slack,
        "the host held {held} > {budget} (+{slack})"
    );

    // Entries: the guest may make more than max_files, but no more come back, and stderr
    // says so.
    let limits = Limits::builder().max_files(3).build().unwrap();
    let r = run_limited(
        s,
        "for n in range(50):\n    open('f%02d' % n, 'w').write('x')\nreturn 50",
        limits,
    )
    .await;
    assert!(r.files.len() <= 3, "{:?}", paths(&r));
    assert!(
        r.stderr
            .contains("holds more than max_files (3) files and directories"),
        "{}",
        r.stderr
    );
}

async fn bad_input_names_are_invalid_input(s: &Subject) {
    for bad in [
        "../escape",
        "/etc/passwd",
        "a//b",
        "nul\0byte",
        "a/../b",
        "",
    ] {
        let r = runner(s)
            .run_request(RunRequest::new("pass").file(InputFile::new(bad, b"x".to_vec())))
            .await;
        assert_kind(&r, ErrorKind::InvalidInput);
        let message = &r.error.as_ref().unwrap().message;
        assert!(message.starts_with("input file `"), "{bad:?}: {message}");
    }
    let limits = Limits::builder().max_input_bytes(4).build().unwrap();
    let r = runner(s)
        .run_request(
            RunRequest::new("pass")
                .file(InputFile::new("a", b"12345".to_vec()))
                .limits(limits),
        )
        .await;
    assert_kind(&r, ErrorKind::InvalidInput);
}

/// Escape attempts through the scratch directory: none reaches a host file.
async fn escapes_stay_inside(s: &Subject) {
    let host = tempfile::tempdir().unwrap();
    let canary = host.path().join("secret.txt");
    std::fs::write(&canary, "CANARY-SCRATCH-ESCAPE").unwrap();
    let canary = canary.display().to_string();
    let host_dir = host.path().display().to_string();
    let code = format!(
        r#"
import os
seen = {{}}
def attempt(name, f):
    try:
        seen[name] = f()
    except OSError as e:
        seen[name] = "OSError"
attempt("dotdot", lambda: open("../../../../../..{canary}").read())
attempt("absolute", lambda: open("{canary}").read())
attempt("passwd", lambda: open("/etc/passwd").read())
# A link out may not even be made; if it is, it leads nowhere.
attempt("mk_to_canary", lambda: os.symlink("{canary}", "to_canary"))
attempt("symlink", lambda: open("to_canary").read())
attempt("mk_to_passwd", lambda: os.symlink("/etc/passwd", "to_passwd"))
attempt("symlink_passwd", lambda: open("to_passwd").read())
attempt("mk_to_dir", lambda: os.symlink("{host_dir}", "to_dir"))
attempt("symlink_dir", lambda: os.listdir("to_dir"))
attempt("mk_up", lambda: os.symlink("../..", "up"))
attempt("symlink_up", lambda: os.listdir("up"))
attempt("hardlink", lambda: os.link("{canary}", "hard"))
open("mine", "w").write("m")
attempt("rename_out", lambda: os.rename("mine", "../../mine"))
attempt("rename_abs", lambda: os.rename("mine", "{host_dir}/mine"))
open("{host_dir}".lstrip("/").replace("/", "_"), "w").write("named like a host path")
return seen
"#
    );
    let r = runner(s).run(&code).await;
    assert!(r.ok, "{r:#?}");
    let text = serde_json::to_string(&r).unwrap();
    assert!(!text.contains("CANARY-SCRATCH-ESCAPE"), "{text}");
    assert!(!text.contains("root:x:0:0"), "{text}");
    for key in [
        "dotdot",
        "absolute",
        "passwd",
        "symlink",
        "symlink_passwd",
        "symlink_dir",
        "hardlink",
        "rename_out",
        "rename_abs",
    ] {
        assert_eq!(r.value[key], json!("OSError"), "{key}: {r:#?}");
    }
    if s.native() {
        // Native CPython may follow `../..` out of /work: it reaches the sandbox's own root,
        // which has no /etc, never the host's.
        let listing = r.value["symlink_up"].as_array().expect("a listing");
        assert!(listing.contains(&json!("work")), "{listing:?}");
        assert!(
            !listing.contains(&json!("etc")),
            "the host's root: {listing:?}"
        );
    } else {
        assert_eq!(r.value["symlink_up"], json!("OSError"), "{r:#?}");
    }
    assert!(!host.path().join("mine").exists());
    // Links are never followed on the way out; the files that stayed inside come back.
    let produced = paths(&r);
    assert!(produced.contains(&"mine"), "{produced:?}");
    for link in ["to_canary", "to_passwd", "to_dir", "up"] {
        assert!(!produced.contains(&link), "{link} in {produced:?}");
    }
    assert_eq!(
        std::fs::read_to_string(host.path().join("secret.txt")).unwrap(),
        "CANARY-SCRATCH-ESCAPE"
    );
}

async fn returned_bytes_are_capped(s: &Subject) {
    let limits = Limits::builder().max_returned_bytes(1_000).build().unwrap();
    let r = runner(s)
        .run_request(
            RunRequest::new(
                "open('a.bin', 'wb').write(b'a' * 600)\nopen('b.bin', 'wb').write(b'b' * 600)",
            )
            .limits(limits),
        )
        .await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(paths(&r), ["a.bin", "b.bin"]);
    assert_eq!(r.files[0].bytes.as_ref().map(Vec::len), Some(600));
    assert_eq!((r.files[1].size, r.files[1].bytes.as_ref()), (600, None));
}

backend_suite! {
    [
        inputs_are_read_and_produced_files_return,
        budgets_give_oserror_and_the_run_goes_on,
        bad_input_names_are_invalid_input,
        escapes_stay_inside,
        returned_bytes_are_capped,
    ]
    wasm => "wasm",
    layered => "wasm+bubblewrap",
}

/// bubblewrap: the same cases, but the budgets, which the kernel enforces there.
mod native_files {
    use super::*;

    crate::backend_suite! {
        [
            inputs_are_read_and_produced_files_return,
            native_budgets_give_oserror_and_the_run_goes_on,
            bad_input_names_are_invalid_input,
            escapes_stay_inside,
            returned_bytes_are_capped,
        ]
        bubblewrap => "bubblewrap",
    }
}

async fn native_backends_refuse_input_files(s: &Subject) {
    let r = runner(s)
        .run_request(RunRequest::new("pass").file(InputFile::new("a.txt", b"x".to_vec())))
        .await;
    assert_kind(&r, ErrorKind::InvalidInput);
    assert!(
        r.error
            .as_ref()
            .unwrap()
            .message
            .contains("does not take input files yet"),
        "{r:#?}"
    );
}

mod native {
    use super::*;

    crate::backend_suite! {
        [native_backends_refuse_input_files]
        docker => "docker",
        local => "local",
    }
}
