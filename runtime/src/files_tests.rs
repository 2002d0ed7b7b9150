use super::*;

#[test]
fn good_paths_pass() {
    for p in [
        "data.csv",
        "a/b/c.json",
        "with space.txt",
        "ünïcode/名前.txt",
        ".hidden",
    ] {
        assert!(check_path(p).is_ok(), "{p}");
    }
}

#[test]
fn bad_paths_are_invalid_input_naming_the_path() {
    let long_name = "x".repeat(MAX_NAME_BYTES + 1);
    let long_path = vec!["a"; MAX_PATH_BYTES].join("/");
    let deep = vec!["d"; MAX_DEPTH + 1].join("/");
    for (p, why) in [
        ("", "empty"),
        ("/etc/passwd", "absolute"),
        ("../x", "`..`"),
        ("a/../../x", "`..`"),
        ("./a", "`.`"),
        ("a//b", "empty component"),
        ("a/", "empty component"),
        ("a\0b", "control character"),
        ("a\\b", "backslash"),
        ("line\nbreak", "control character"),
        (long_name.as_str(), "component is longer"),
        (long_path.as_str(), "longer than"),
        (deep.as_str(), "deeper than"),
    ] {
        let e = check_path(p).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput, "{p:?}");
        assert!(e.message.contains(why), "{p:?}: {}", e.message);
        assert!(e.message.starts_with("input file `"), "{}", e.message);
    }
}

#[test]
fn inputs_are_checked_together_against_the_budgets() {
    let limits = Limits::builder()
        .max_input_bytes(10)
        .max_file_bytes(6)
        .max_files(3)
        .build()
        .unwrap();
    let f = |p: &str, n: usize| InputFile::new(p, vec![b'x'; n]);
    assert!(check_inputs(&[f("a", 5), f("d/b", 5)], &limits).is_ok());
    for (files, why) in [
        (vec![f("a", 7)], "the limit for one file is 6"),
        (vec![f("a", 6), f("b", 6)], "12 bytes; the limit is 10"),
        (vec![f("a", 1), f("a", 1)], "given twice"),
        (vec![f("a", 1), f("a/b", 1)], "also a directory"),
        (
            vec![f("a/b/c", 1), f("d", 1)],
            "4 files and directories; the limit is 3",
        ),
    ] {
        let e = check_inputs(&files, &limits).unwrap_err();
        assert!(e.message.contains(why), "{why}: {}", e.message);
    }
}

#[test]
fn usage_counts_every_write_and_refuses_past_the_budgets() {
    let limits = Limits::builder()
        .max_written_bytes(100)
        .max_file_bytes(60)
        .max_files(2)
        .build()
        .unwrap();
    let u = Usage::new(&limits, 1);
    assert_eq!(u.write(60, 60), Ok(()));
    assert_eq!(u.write(61, 1), Err(Refusal::FileTooLarge));
    assert_eq!(u.write(40, 40), Ok(()));
    assert_eq!(u.write(1, 1), Err(Refusal::NoSpace), "100 of 100 written");
    assert_eq!(u.written(), 100);
    assert_eq!(u.add_entry(), Ok(()));
    assert_eq!(u.add_entry(), Err(Refusal::NoSpace), "2 of 2 entries");
}

#[test]
fn a_scratch_directory_returns_what_changed_and_nothing_it_cannot_trust() {
    let limits = Limits::default();
    let inputs = [
        InputFile::new("same.txt", b"unchanged".to_vec()),
        InputFile::new("edit.txt", b"before".to_vec()),
        InputFile::new("dir/in.csv", b"a,b".to_vec()),
    ];
    let scratch = Scratch::create(inputs.to_vec(), &limits).unwrap();
    let root = scratch.host_path().unwrap().to_owned();
    std::fs::write(root.join("edit.txt"), b"after!").unwrap();
    std::fs::write(root.join("dir/new.bin"), [0u8, 1, 2]).unwrap();
    #[cfg(unix)]
    {
        // A link out of the directory, and one to a file inside it: neither is followed.
        std::os::unix::fs::symlink("/etc/passwd", root.join("passwd")).unwrap();
        std::os::unix::fs::symlink("same.txt", root.join("alias")).unwrap();
    }
    let out = scratch.produced(u64::MAX);
    let paths: Vec<_> = out.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["dir/new.bin", "edit.txt"]);
    assert_eq!(out[0].bytes.as_deref(), Some(&[0u8, 1, 2][..]));
    assert_eq!(out[1].bytes.as_deref(), Some(&b"after!"[..]));
    // Past the returned budget: listed with their size, without bytes.
    let out = scratch.produced(4);
    assert_eq!(out[0].bytes.as_deref(), Some(&[0u8, 1, 2][..]));
    assert_eq!((out[1].size, out[1].bytes.as_ref()), (6, None));
    drop(scratch);
    assert!(!root.exists(), "the directory went with its owner");
}

#[test]
fn a_bounded_walk_looks_at_no_more_entries_than_it_may() {
    let limits = Limits::default();
    let scratch = Scratch::create(Vec::new(), &limits).unwrap();
    let root = scratch.host_path().unwrap().to_owned();
    for n in 0..10 {
        std::fs::write(root.join(format!("f{n}")), b"x").unwrap();
    }
    let (all, overflow) = scratch.produced_within(u64::MAX, 10);
    assert_eq!((all.len(), overflow), (10, false));
    let (some, overflow) = scratch.produced_within(u64::MAX, 4);
    assert_eq!((some.len(), overflow), (4, true));
    // A directory's entries count too.
    std::fs::create_dir(root.join("d")).unwrap();
    std::fs::write(root.join("d/inner"), b"y").unwrap();
    let (_, overflow) = scratch.produced_within(u64::MAX, 11);
    assert!(overflow);
}
