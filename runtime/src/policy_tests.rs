use pycage_tools::ToolRegistry;
use serde_json::json;

use super::*;

fn registry() -> ToolRegistry {
    let mut r = ToolRegistry::with_builtins();
    r.register_fn(
        "other",
        "add",
        "another add",
        json!({"type": "object"}),
        |_| async { Ok(json!(null)) },
    )
    .unwrap();
    r
}

#[test]
fn the_empty_policy_exposes_nothing() {
    let exposed = ToolPolicy::new().resolve(&registry()).unwrap();
    assert!(exposed.is_empty());
    assert!(exposed.lookup("add").is_none());
    assert!(exposed.lookup("math.add").is_none());
}

#[test]
fn a_namespace_exposes_its_tools_by_bare_and_qualified_name() {
    let exposed = ToolPolicy::new()
        .namespace("math")
        .resolve(&registry())
        .unwrap();
    assert_eq!(
        exposed.qualified_names(),
        ["math.add", "math.divide", "math.multiply", "math.subtract"]
    );
    assert!(exposed.lookup("add").is_some());
    assert!(exposed.lookup("math.add").is_some());
    assert!(exposed.lookup("text.echo").is_none());
    assert!(exposed.lookup("other.add").is_none());
}

#[test]
fn allow_with_namespace_narrows_to_the_listed_tools() {
    let exposed = ToolPolicy::new()
        .namespace("math")
        .allow("add")
        .allow("math.divide")
        .resolve(&registry())
        .unwrap();
    assert_eq!(exposed.qualified_names(), ["math.add", "math.divide"]);
    assert!(exposed.lookup("subtract").is_none());
}

#[test]
fn allow_alone_takes_qualified_or_unique_bare_names() {
    let exposed = ToolPolicy::new()
        .allow("echo")
        .allow("math.add")
        .resolve(&registry())
        .unwrap();
    assert_eq!(exposed.qualified_names(), ["math.add", "text.echo"]);
    let err = ToolPolicy::new()
        .allow("add")
        .resolve(&registry())
        .unwrap_err();
    assert!(err.to_string().contains("ambiguous"), "{err}");
}

#[test]
fn clashing_bare_names_are_reachable_only_qualified() {
    let exposed = ToolPolicy::new()
        .allow("math.add")
        .allow("other.add")
        .resolve(&registry())
        .unwrap();
    assert!(exposed.lookup("add").is_none());
    assert!(exposed.lookup("math.add").is_some());
    assert!(exposed.lookup("other.add").is_some());
    assert!(exposed.bindings().iter().all(|b| b.binding.is_none()));
}

#[test]
fn typos_and_out_of_namespace_entries_fail_loudly() {
    let r = registry();
    let e = ToolPolicy::new()
        .namespace("maths")
        .resolve(&r)
        .unwrap_err();
    assert!(e.to_string().contains("maths"), "{e}");
    let e = ToolPolicy::new().allow("math.ad").resolve(&r).unwrap_err();
    assert!(e.to_string().contains("math.ad"), "{e}");
    let e = ToolPolicy::new()
        .namespace("math")
        .allow("text.echo")
        .resolve(&r)
        .unwrap_err();
    assert!(
        e.to_string().contains("outside the pinned namespace"),
        "{e}"
    );
    let e = ToolPolicy::new()
        .namespace("math")
        .allow("echo")
        .resolve(&r)
        .unwrap_err();
    assert!(
        e.to_string().contains("not registered in namespace `math`"),
        "{e}"
    );
}

#[test]
fn bindings_carry_each_tools_parameter_schema() {
    let exposed = ToolPolicy::new()
        .allow("text.echo")
        .resolve(&registry())
        .unwrap();
    let [echo] = exposed.bindings() else {
        panic!("one binding")
    };
    assert_eq!(echo.qualified, "text.echo");
    assert_eq!(
        echo.parameters["properties"]["text"]["type"],
        json!("string")
    );
    assert_eq!(echo.parameters["required"], json!(["text"]));
}

#[test]
fn each_fault_has_its_kind_naming_the_entry() {
    let r = registry();
    let resolve = |p: ToolPolicy| p.resolve(&r).unwrap_err();
    assert_eq!(
        resolve(ToolPolicy::new().namespace("maths")),
        PolicyError::EmptyNamespace("maths".into())
    );
    assert_eq!(
        resolve(ToolPolicy::new().allow(" math.ad ")),
        PolicyError::UnknownTool {
            entry: "math.ad".into(),
            namespace: None
        }
    );
    assert_eq!(
        resolve(ToolPolicy::new().namespace("math").allow("echo")),
        PolicyError::UnknownTool {
            entry: "echo".into(),
            namespace: Some("math".into())
        }
    );
    assert_eq!(
        resolve(ToolPolicy::new().namespace("math").allow("text.echo")),
        PolicyError::OutsideNamespace {
            entry: "text.echo".into(),
            namespace: "math".into()
        }
    );
    assert_eq!(
        resolve(ToolPolicy::new().allow("add")),
        PolicyError::Ambiguous {
            entry: "add".into(),
            candidates: ["math.add".into(), "other.add".into()]
        }
    );
}

#[test]
fn lookup_is_exact() {
    let exposed = ToolPolicy::new()
        .namespace("math")
        .resolve(&registry())
        .unwrap();
    for variant in [
        "Add",
        "add ",
        " add",
        "add\0",
        "math.Add",
        "ａdd",
        "math..add",
        ".add",
        "math.add.x",
    ] {
        assert!(
            exposed.lookup(variant).is_none(),
            "{variant:?} must not resolve"
        );
    }
}

#[test]
fn a_run_replaces_an_exposed_tool_by_its_qualified_and_bare_names_only() {
    let exposed = ToolPolicy::new()
        .allow("math.multiply")
        .allow("other.add")
        .allow("math.add")
        .resolve(&registry())
        .unwrap();
    let mut narrower = ToolRegistry::new();
    narrower
        .register_fn("math", "multiply", "narrower", json!({}), |_| async {
            Ok(json!(0))
        })
        .unwrap();
    let tool = narrower.get("math", "multiply").unwrap().clone();
    let replaced = exposed.replaced(tool).unwrap();
    for name in ["multiply", "math.multiply"] {
        assert_eq!(replaced.lookup(name).unwrap().description(), "narrower");
    }
    // The others, and what the guest is told, stay.
    assert_ne!(
        replaced.lookup("math.add").unwrap().description(),
        "narrower"
    );
    assert_eq!(replaced.bindings(), exposed.bindings());
    assert_ne!(
        exposed.lookup("multiply").unwrap().description(),
        "narrower"
    );

    let mut stranger = ToolRegistry::new();
    stranger
        .register_fn("math", "divide", "not exposed", json!({}), |_| async {
            Ok(json!(0))
        })
        .unwrap();
    let tool = stranger.get("math", "divide").unwrap().clone();
    assert_eq!(exposed.replaced(tool).err().unwrap(), "math.divide");
}
