//! Values and output on their way through the host, on every backend: floats bit for bit,
//! integers exact within 64 bits and refused beyond, nesting up to the documented 200 levels,
//! and a single write of any size up to the output cap arriving whole.

use crate::common;
use crate::os_support;

use common::assert_kind;
use os_support::Subject;
use pycage::{ErrorKind, Limits, ToolPolicy};
use pycage_tools::ToolRegistry;
use serde_json::{Value, json};

/// A runner whose one tool, `values.echo`, returns its arguments object as it got it.
fn echo_runner(s: &Subject, limits: Limits) -> pycage::Runner {
    let mut tools = ToolRegistry::new();
    tools
        .register_fn(
            "values",
            "echo",
            "Returns its arguments.",
            json!({"type": "object"}),
            |args| async move { Ok(Value::Object(args)) },
        )
        .unwrap();
    s.runner(tools, ToolPolicy::new().namespace("values"), limits)
}

/// The issue's program (floats at every scale), every special float, and 4,000 floats drawn
/// from random bits (so every exponent, subnormals included), through the return value and
/// through a tool's arguments and result.
const FLOATS: &str = r#"
import math, random, struct
random.seed(1)
xs = [random.uniform(-1, 1) * 10 ** random.randint(-300, 300) for _ in range(2000)]
xs += [-0.0, 0.0, 5e-324, -5e-324, 2.225073858507201e-308, 2.2250738585072014e-308,
       1.7976931348623157e308, -1.7976931348623157e308, 8.888888888888888e+60,
       -7.312715117751976e-237, 0.1, 1e21, 1e-7]
rng = random.Random(7)
while len(xs) < 6013:
    x = struct.unpack('<d', struct.pack('<Q', rng.getrandbits(64)))[0]
    if math.isfinite(x):
        xs.append(x)
bits = [struct.unpack('<Q', struct.pack('<d', x))[0] for x in xs]
echoed = (await echo(xs=xs))['xs']
changed = sum(struct.pack('<d', a) != struct.pack('<d', b) for a, b in zip(xs, echoed))
return {'xs': xs, 'bits': bits, 'echoed': len(echoed), 'changed_by_the_tool': changed}
"#;

async fn floats_cross_bit_for_bit(s: &Subject) {
    let r = echo_runner(s, Limits::default()).run(FLOATS).await;
    assert!(r.ok, "{r:#?}");
    let xs = r.value["xs"].as_array().unwrap();
    let bits = r.value["bits"].as_array().unwrap();
    assert_eq!(xs.len(), 6013);
    assert_eq!(bits.len(), xs.len());
    let changed: Vec<_> = xs
        .iter()
        .zip(bits)
        .filter(|(x, b)| x.as_f64().map(f64::to_bits) != b.as_u64())
        .map(|(x, _)| x.to_string())
        .collect();
    assert!(
        changed.is_empty(),
        "{} floats changed on the way back: {:?}",
        changed.len(),
        &changed[..changed.len().min(5)]
    );
    assert_eq!(r.value["echoed"], json!(6013));
    assert_eq!(r.value["changed_by_the_tool"], json!(0));
}

async fn integers_are_exact_within_64_bits(s: &Subject) {
    let runner = echo_runner(s, Limits::default());
    let r = runner
        .run(
            "ok = [-(2**63), 2**63 - 1, 2**64 - 1, 2**53 + 1, -(2**53) - 1, 0]\n\
             echoed = (await echo(ok=ok))['ok']\n\
             try:\n    await echo(n=2**64)\n    refused = None\n\
             except ToolError as e:\n    refused = [e.kind, str(e)]\n\
             return [ok, echoed == ok, refused]",
        )
        .await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(
        r.value[0],
        json!([
            i64::MIN,
            i64::MAX,
            u64::MAX,
            (1u64 << 53) + 1,
            -(1i64 << 53) - 1,
            0
        ])
    );
    assert_eq!(r.value[1], json!(true), "the tool changed an integer");
    assert_eq!(r.value[2][0], json!("invalid-arguments"), "{r:#?}");
    let message = r.value[2][1].as_str().unwrap();
    assert!(
        message.contains("in the arguments, the integer 18446744073709551616 is outside")
            && message.contains("as a string"),
        "{message}"
    );
    assert_eq!(r.tool_calls, 1, "the refused call was not executed");

    for (code, digits) in [
        ("return 2**70 + 1", "1180591620717411303425"),
        (
            "return [1, {'n': -(2**100)}]",
            "-1267650600228229401496703205376",
        ),
        ("return 2**64", "18446744073709551616"),
    ] {
        let r = runner.run(code).await;
        assert_kind(&r, ErrorKind::GuestException);
        let message = &r.error.as_ref().unwrap().message;
        assert!(
            message.contains(&format!(
                "in the return value, the integer {digits} is outside"
            )) && message.contains("str(n)"),
            "{code}: {message}"
        );
    }
}

/// Lists nested `depth` deep around a 1.
const NEST: &str =
    "def nest(depth):\n    v = 1\n    for _ in range(depth):\n        v = [v]\n    return v\n";

async fn nesting_up_to_the_bound_crosses(s: &Subject) {
    let runner = echo_runner(s, Limits::default());
    let r = runner.run(&format!("{NEST}return nest(200)")).await;
    assert!(r.ok, "{r:#?}");
    let mut v = &r.value;
    let mut depth = 0;
    while let Some(inner) = v.get(0) {
        v = inner;
        depth += 1;
    }
    assert_eq!((depth, v), (200, &json!(1)));

    let r = runner.run(&format!("{NEST}return nest(201)")).await;
    assert_kind(&r, ErrorKind::GuestException);
    assert!(
        r.error
            .as_ref()
            .unwrap()
            .message
            .contains("nests deeper than 200 levels"),
        "{r:#?}"
    );

    // The arguments object is a level: 199 lists inside it is the bound.
    let r = runner
        .run(&format!(
            "{NEST}back = (await echo(x=nest(199)))['x']\n\
             try:\n    await echo(x=nest(200))\nexcept ToolError as e:\n    return [back == nest(199), e.kind, str(e)]"
        ))
        .await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.value[0], json!(true));
    assert_eq!(r.value[1], json!("invalid-arguments"));
    assert!(
        r.value[2]
            .as_str()
            .unwrap()
            .contains("in the arguments, arrays and objects nest deeper than 200 levels"),
        "{r:#?}"
    );
}

const CAP: u64 = 1 << 20;

async fn a_single_write_up_to_the_cap_arrives_whole(s: &Subject) {
    let limits = Limits::builder().max_output_bytes(CAP).build().unwrap();
    let runner = echo_runner(s, limits);
    let r = runner
        .run("import sys\nprint('x' * 100000)\nsys.stderr.write('e' * 300000)")
        .await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.stdout.len(), 100_001);
    assert!(r.stdout.bytes().take(100_000).all(|b| b == b'x') && r.stdout.ends_with('\n'));
    assert_eq!(r.stderr, "e".repeat(300_000));
    assert!(!r.stdout_truncated && !r.stderr_truncated);

    // Exactly the cap, in one write, is whole; one byte more sets the flag and the marker.
    let r = runner
        .run(&format!("import sys\nsys.stdout.write('y' * {CAP})"))
        .await;
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.stdout.len() as u64, CAP);
    assert!(!r.stdout_truncated);
    let r = runner
        .run(&format!(
            "import sys\nsys.stdout.write('z' * {})\nsys.stderr.write('w' * {})",
            CAP + 1,
            3 * CAP
        ))
        .await;
    assert!(r.ok, "{r:#?}");
    for (text, truncated, cut) in [
        (&r.stdout, r.stdout_truncated, 1),
        (&r.stderr, r.stderr_truncated, 2 * CAP),
    ] {
        assert!(truncated, "{}", text.len());
        let marker = format!("\n[... {cut} bytes cut by pycage ...]\n");
        assert!(text.contains(&marker), "no {marker:?}");
        assert_eq!(text.len() as u64, CAP + marker.len() as u64);
    }
}

every_backend!([
    floats_cross_bit_for_bit,
    integers_are_exact_within_64_bits,
    nesting_up_to_the_bound_crosses,
    a_single_write_up_to_the_cap_arrives_whole,
]);
