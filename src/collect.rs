//! Collecting an iterator whose size hint may lie.

/// Collects `items` into a `Vec` that grows as they come. `collect` and `extend` reserve the
/// lower bound of the iterator's size hint up front, so an iterator that claims more than
/// it yields would make them panic (capacity overflow) or abort the process (a refused
/// allocation) before the first item.
pub(crate) fn collect_as_they_come<T>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut all = Vec::new();
    for item in items {
        all.push(item);
    }
    all
}
