use super::*;

fn file(path: &str, bytes: Option<&[u8]>) -> OutputFile {
    let mut f: OutputFile = serde_json::from_value(serde_json::json!({
        "path": path, "size": bytes.map_or(0, <[u8]>::len), "bytes": null,
    }))
    .unwrap();
    f.bytes = bytes.map(<[u8]>::to_vec);
    f
}

#[test]
fn a_text_file_is_a_text_resource_and_its_path_is_escaped() {
    let block = file_resource(&file("out/a b#.csv", Some(b"x,y\n"))).unwrap();
    let ContentBlock::Resource(embedded) = &block else {
        panic!("{block:?}")
    };
    match &embedded.resource {
        ResourceContents::TextResourceContents { uri, text, .. } => {
            assert_eq!(uri, "pycage-file:///out/a%20b%23.csv");
            assert_eq!(text, "x,y\n");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_binary_file_is_a_blob_and_one_past_the_budget_is_left_to_the_listing() {
    let block = file_resource(&file("b.bin", Some(&[0, 255]))).unwrap();
    let ContentBlock::Resource(embedded) = &block else {
        panic!("{block:?}")
    };
    match &embedded.resource {
        ResourceContents::BlobResourceContents {
            blob, mime_type, ..
        } => {
            assert_eq!(blob, "AP8=");
            assert_eq!(mime_type.as_deref(), Some("application/octet-stream"));
        }
        other => panic!("{other:?}"),
    }
    assert!(file_resource(&file("big.bin", None)).is_none());
}
