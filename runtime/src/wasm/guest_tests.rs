use super::*;

/// A manifest for `component` as this pycage writes it.
fn manifest(component: &[u8]) -> GuestManifest {
    GuestManifest::new(
        component,
        "3.14.0",
        vec![Package::new("attrs", "25.4.0", "ab".repeat(32))],
        vec!["attrs".into()],
    )
}

fn builtin() -> Vec<u8> {
    Guest::builtin().bytes().to_vec()
}

#[test]
fn a_sealed_component_is_a_guest_with_its_manifest() {
    let component = builtin();
    let sealed = seal(&component, &manifest(&component)).unwrap();
    let guest = Guest::from_bytes(sealed.clone()).unwrap();
    assert!(!guest.is_builtin());
    assert_eq!(guest.manifest(), Some(&manifest(&component)));
    assert_eq!(guest.digest(), blake3::hash(&sealed).to_hex().as_str());
    assert_ne!(guest.digest(), Guest::builtin().digest());
    assert!(Guest::builtin().is_builtin());
}

#[test]
fn what_is_not_a_guest_file_is_refused_as_such() {
    for (bytes, why) in [
        (b"not wasm at all".to_vec(), "does not parse"),
        (b"\0asm\x01\x00\x00\x00".to_vec(), "not a component"),
        (builtin(), "does not end with a `pycage-guest` section"),
    ] {
        let err = Guest::from_bytes(bytes).unwrap_err();
        assert!(
            matches!(&err, GuestError::NotAGuest(m) if m.contains(why)),
            "{why}: {err}"
        );
    }
    // A manifest section that is not the last one does not count.
    let component = builtin();
    let mut sealed = seal(&component, &manifest(&component)).unwrap();
    sealed.extend_from_slice(&[0, 4, 3, b'e', b'n', b'd']);
    assert!(matches!(
        Guest::from_bytes(sealed),
        Err(GuestError::NotAGuest(_))
    ));
}

#[test]
fn a_changed_byte_is_corruption() {
    let component = builtin();
    let mut sealed = seal(&component, &manifest(&component)).unwrap();
    // A byte of the heap snapshot's data, far from any structure the parser checks.
    let at = component.len() / 2;
    sealed[at] ^= 0x01;
    let err = Guest::from_bytes(sealed).unwrap_err();
    let GuestError::Corrupted { expected, actual } = &err else {
        panic!("{err}")
    };
    assert_ne!(expected, actual);
    assert!(err.to_string().contains("corrupted"), "{err}");
}

#[test]
fn a_guest_of_another_pycage_version_is_refused_by_name() {
    let component = builtin();
    let mut m = manifest(&component);
    m.pycage = "0.0.1".into();
    let err = Guest::from_bytes(seal(&component, &m).unwrap()).unwrap_err();
    assert!(matches!(&err, GuestError::OtherVersion { built_by } if built_by == "0.0.1"));
    assert!(err.to_string().contains("pycage guest build"), "{err}");
    let mut m = manifest(&component);
    m.format = FORMAT + 1;
    let err = Guest::from_bytes(seal(&component, &m).unwrap()).unwrap_err();
    assert!(matches!(err, GuestError::Malformed(_)), "{err}");
}

#[test]
fn a_guest_that_imports_anything_else_is_refused_before_compiling() {
    use wasm_encoder::{Component, ComponentImportSection, ComponentTypeRef, InstanceType};
    let mut imports = ComponentImportSection::new();
    let instance = InstanceType::new();
    let mut types = wasm_encoder::ComponentTypeSection::new();
    types.instance(&instance);
    for name in [
        "wasi:cli/stdout@0.2.9",
        "wasi:sockets/tcp@0.2.9",
        "evil:net/raw@1.0.0",
    ] {
        imports.import(name, ComponentTypeRef::Instance(0));
    }
    let mut component = Component::new();
    component.section(&types).section(&imports);
    let component = component.finish();
    let err = Guest::from_bytes(seal(&component, &manifest(&component)).unwrap()).unwrap_err();
    let GuestError::Imports(extra) = &err else {
        panic!("{err}")
    };
    assert_eq!(extra, &["evil:net/raw@1.0.0"]);
}

#[test]
fn a_guest_file_that_cannot_be_read_names_the_path() {
    let err = Guest::from_path(Path::new("/nonexistent/guest.wasm")).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/guest.wasm"), "{err}");
}
