//! placeholder
#[test]
fn placeholder() {}
