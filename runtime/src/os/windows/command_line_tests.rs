use super::*;

/// The Microsoft C runtime's parser (the rules since 2008), as a reference: the program up to
/// its closing quote, then arguments split on spaces and tabs outside quotes, `2n`
/// backslashes and a quote read as `n` backslashes and a quote mark, `2n + 1` as `n` and a
/// literal quote, `""` inside quotes as a literal quote, other backslashes literal.
fn parse(line: &str) -> (String, Vec<String>) {
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    let mut program = String::new();
    if chars.first() == Some(&'"') {
        i = 1;
        while i < chars.len() && chars[i] != '"' {
            program.push(chars[i]);
            i += 1;
        }
        i += 1;
    } else {
        while i < chars.len() && !matches!(chars[i], ' ' | '\t') {
            program.push(chars[i]);
            i += 1;
        }
    }
    let mut args = Vec::new();
    loop {
        while i < chars.len() && matches!(chars[i], ' ' | '\t') {
            i += 1;
        }
        if i >= chars.len() {
            return (program, args);
        }
        let mut arg = String::new();
        let mut quoted = false;
        while i < chars.len() {
            let c = chars[i];
            if !quoted && matches!(c, ' ' | '\t') {
                break;
            }
            match c {
                '\\' => {
                    let n = chars[i..].iter().take_while(|&&c| c == '\\').count();
                    i += n;
                    if chars.get(i) == Some(&'"') {
                        arg.extend(std::iter::repeat_n('\\', n / 2));
                        if n % 2 == 1 {
                            arg.push('"');
                            i += 1;
                        }
                    } else {
                        arg.extend(std::iter::repeat_n('\\', n));
                    }
                }
                '"' if quoted && chars.get(i + 1) == Some(&'"') => {
                    arg.push('"');
                    i += 2;
                }
                '"' => {
                    quoted = !quoted;
                    i += 1;
                }
                c => {
                    arg.push(c);
                    i += 1;
                }
            }
        }
        args.push(arg);
    }
}

fn quoted(arg: &str) -> String {
    let mut out = String::new();
    quote_arg(arg, &mut out);
    out
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn plain_arguments_go_as_they_are() {
    assert_eq!(quoted("abc"), "abc");
    assert_eq!(quoted(r"C:\dir\file.py"), r"C:\dir\file.py");
    assert_eq!(quoted(r"trailing\"), r"trailing\");
    assert_eq!(quoted("-I"), "-I");
}

#[test]
fn the_documented_cases() {
    // The examples of Microsoft's "Parsing C command-line arguments", from the other side.
    assert_eq!(quoted(""), r#""""#);
    assert_eq!(quoted("a b"), r#""a b""#);
    assert_eq!(quoted(r#"a"b"#), r#""a\"b""#);
    assert_eq!(quoted(r#"a\"b"#), r#""a\\\"b""#);
    assert_eq!(quoted(r"a\\b c"), r#""a\\b c""#);
    assert_eq!(quoted(r"dir with space\"), r#""dir with space\\""#);
    assert_eq!(quoted(r"two\\"), r"two\\");
    assert_eq!(quoted("tab\there"), "\"tab\there\"");
    assert_eq!(quoted("\""), r#""\"""#);
}

#[test]
fn the_command_line_reads_back_as_its_arguments() {
    let program = r"C:\Program Files\Python313\python.exe";
    let args = strings(&["-I", "", "a b", r"c:\x\", r#"q"uote"#, r"\\server\share\"]);
    let line = command_line(program, &args).unwrap();
    assert_eq!(
        line,
        r#""C:\Program Files\Python313\python.exe" -I "" "a b" c:\x\ "q\"uote" \\server\share\"#
    );
    assert_eq!(parse(&line), (program.to_owned(), args));
}

#[test]
fn every_short_argument_over_the_hard_characters_round_trips() {
    // Every string of up to five characters over the characters the rules treat specially,
    // alone and beside its neighbours.
    const ALPHABET: [char; 5] = ['a', ' ', '\t', '\\', '"'];
    let mut all = vec![String::new()];
    let mut last = vec![String::new()];
    for _ in 0..5 {
        let next: Vec<String> = last
            .iter()
            .flat_map(|s| {
                ALPHABET.iter().map(move |c| {
                    let mut t = s.clone();
                    t.push(*c);
                    t
                })
            })
            .collect();
        all.extend(next.iter().cloned());
        last = next;
    }
    assert_eq!(all.len(), 1 + 5 + 25 + 125 + 625 + 3125);
    for (i, arg) in all.iter().enumerate() {
        let neighbour = &all[(i * 7 + 3) % all.len()];
        let args = vec![arg.clone(), neighbour.clone(), arg.clone()];
        let line = command_line(r"C:\p\python.exe", &args).unwrap();
        assert_eq!(parse(&line).1, args, "{line}");
    }
}

#[test]
fn programs_and_arguments_that_cannot_be_carried_are_refused() {
    assert_eq!(
        command_line(r#"C:\a"b.exe"#, &[]),
        Err(RenderError::QuoteInProgram)
    );
    assert_eq!(
        command_line(r"C:\p.exe", &strings(&["a\0b"])),
        Err(RenderError::Nul)
    );
    assert_eq!(command_line("C:\\p\0.exe", &[]), Err(RenderError::Nul));
    let long = "x".repeat(MAX_COMMAND_LINE_UNITS);
    assert_eq!(
        command_line(r"C:\p.exe", &[long]),
        Err(RenderError::TooLong)
    );
    // Just under the limit: the quoted program, a space, the argument and the NUL.
    let fits = "x".repeat(MAX_COMMAND_LINE_UNITS - r#""C:\p.exe" "#.len() - 1);
    assert!(command_line(r"C:\p.exe", &[fits]).is_ok());
}

fn decode(block: &[u16]) -> Vec<String> {
    assert_eq!(block.last(), Some(&0));
    let text = String::from_utf16(&block[..block.len() - 1]).unwrap();
    text.split_terminator('\0').map(str::to_owned).collect()
}

fn vars(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn the_environment_block_is_sorted_without_regard_to_case() {
    let block = environment_block(&vars(&[
        ("TMP", r"C:\t\work"),
        ("b", "2"),
        ("SystemRoot", r"C:\Windows"),
        ("A", "1"),
        ("TEMP", r"C:\t\work"),
    ]))
    .unwrap();
    assert_eq!(
        decode(&block),
        [
            "A=1",
            "b=2",
            r"SystemRoot=C:\Windows",
            r"TEMP=C:\t\work",
            r"TMP=C:\t\work"
        ]
    );
    // Each pair ends with a NUL, and the block with one more.
    assert_eq!(&block[block.len() - 2..], [0, 0]);
    assert_eq!(block.iter().filter(|&&u| u == 0).count(), 6);
}

#[test]
fn the_environment_block_is_utf16_and_empty_is_two_nuls() {
    assert_eq!(environment_block(&[]).unwrap(), [0, 0]);
    let block = environment_block(&vars(&[("K", "é😀")])).unwrap();
    let mut expected: Vec<u16> = "K=é😀".encode_utf16().collect();
    expected.extend([0, 0]);
    assert_eq!(block, expected);
    assert_eq!(
        expected.len(),
        1 + 1 + 1 + 2 + 2,
        "the emoji is a surrogate pair"
    );
    // Values may hold `=`; only names may not.
    assert!(environment_block(&vars(&[("K", "a=b")])).is_ok());
}

#[test]
fn bad_environments_are_refused() {
    assert_eq!(
        environment_block(&vars(&[("Path", "a"), ("PATH", "b")])),
        Err(RenderError::DuplicateName("PATH".into()))
    );
    assert_eq!(
        environment_block(&vars(&[("", "a")])),
        Err(RenderError::BadName(String::new()))
    );
    assert_eq!(
        environment_block(&vars(&[("A=B", "a")])),
        Err(RenderError::BadName("A=B".into()))
    );
    assert_eq!(
        environment_block(&vars(&[("A", "x\0y")])),
        Err(RenderError::Nul)
    );
}
