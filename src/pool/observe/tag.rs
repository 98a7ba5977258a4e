//! Memory tags: names a caller gives to what its buffers are for (a checkpoint chain, a
//! model's weights), so that a pool's snapshot can say how much memory each holds.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::num::NonZeroU32;
use std::ops::Index;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The tag table: every name a tag was made with, once, for the whole process. Bookkeeping
/// outside any concurrency protocol: only [`MemoryTag::new`] adds to it (never a pool
/// operation, so its allocations cannot re-enter a pool that is the global allocator while
/// a pool lock is held), and [`MemoryTag::name`] only reads it.
static NAMES: Mutex<Names> = Mutex::new(Names {
    by_id: Vec::new(),
    by_name: BTreeMap::new(),
});

struct Names {
    /// Tag `n`'s name is `by_id[n - 1]`; each name is here once.
    by_id: Vec<&'static str>,
    /// Each name's tag (a `BTreeMap`: it can be made in a `static`).
    by_name: BTreeMap<&'static str, NonZeroU32>,
}

/// `name`, stored once for the whole process: the first call with a name leaks a copy,
/// later ones return that copy. Tag names and deserialized span names are stored here.
pub(in crate::pool) fn intern(name: &str) -> &'static str {
    static STRINGS: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    // Bookkeeping: never in a pool.
    let _bookkeeping = crate::thread::Bookkeeping::open();
    // An insert leaves the set whole: a poisoned lock's set is used as it is.
    let mut strings = STRINGS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(&known) = strings.get(name) {
        return known;
    }
    let name: &'static str = Box::leak(Box::from(name));
    strings.insert(name);
    name
}

fn names() -> MutexGuard<'static, Names> {
    // Nothing under the lock leaves the table half-updated (the one panic, the 2^32-names
    // limit, comes before any change), so a poisoned lock's table is used as it is.
    NAMES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A name for memory: every buffer allocated while a tag is [entered](Self::enter) on a
/// thread carries it, and [`BufferPool::memory_by_tag`](crate::BufferPool::memory_by_tag)
/// sums the bytes each tag holds.
///
/// ```
/// use ferropool::{BufferPool, MemoryTag};
/// let pool = BufferPool::new();
/// let activations = MemoryTag::new("activations");
/// let held = {
///     let _scope = activations.enter();
///     pool.alloc(1 << 20)?
/// };
/// let by_tag = pool.memory_by_tag();
/// assert_eq!(by_tag.get(activations), 1 << 20);
/// assert_eq!(MemoryTag::new("activations"), activations); // tags are interned by name
/// # drop(held);
/// # Ok::<(), ferropool::PoolError>(())
/// ```
///
/// Tags are interned: a name is one tag for the whole process, and the table of names lives
/// as long as the process (each distinct name is stored once, however often it is made).
/// Tags order by when their name was first made.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemoryTag(NonZeroU32);

impl MemoryTag {
    /// The tag named `name`: the same tag for the same name, every call, on every thread
    /// (the first call with a name stores it for the whole process; later ones look it up).
    ///
    /// ```
    /// use ferropool::MemoryTag;
    /// let (a, b) = (MemoryTag::new("weights"), MemoryTag::new("weights"));
    /// assert_eq!(a, b); // one name, one tag
    /// assert_ne!(a, MemoryTag::new("grads"));
    /// assert_eq!(a.name(), "weights");
    /// ```
    pub fn new(name: &str) -> Self {
        // The table is bookkeeping: never in a pool (it would count against the pool that
        // serves the global allocator, and run a pool operation under the table's lock).
        let _bookkeeping = crate::thread::Bookkeeping::open();
        let mut guard = names();
        let names = &mut *guard;
        if let Some(&id) = names.by_name.get(name) {
            return Self(id);
        }
        let id = u32::try_from(names.by_id.len() + 1)
            .ok()
            .and_then(NonZeroU32::new)
            .expect("fewer than 2^32 tag names");
        // Stored once per name, for the whole process: a tag may be used anywhere, any time.
        let name = intern(name);
        names.by_id.push(name);
        names.by_name.insert(name, id);
        Self(id)
    }

    /// The tag's name.
    ///
    /// ```
    /// let grads = ferropool::MemoryTag::new("grads");
    /// assert_eq!(grads.name(), "grads");
    /// assert_eq!(grads.to_string(), "grads"); // `Display` shows the name too
    /// ```
    pub fn name(&self) -> &'static str {
        // A read of the table under its lock: no allocation.
        names().by_id[self.0.get() as usize - 1]
    }

    /// Tags the buffers this thread allocates until the returned scope drops. Scopes nest
    /// whatever order they drop in: the thread's tag is always that of its newest live
    /// scope (none once every scope has dropped), so dropping an outer scope first leaves
    /// the inner one's tag, and dropping the inner one then leaves none, never the
    /// outer one's again.
    ///
    /// ```
    /// use ferropool::{BufferPool, MemoryTag};
    /// let pool = BufferPool::new();
    /// let (model, optimizer) = (MemoryTag::new("model"), MemoryTag::new("optimizer"));
    /// let _model = model.enter();
    /// let state = { let _optimizer = optimizer.enter(); pool.alloc(64)? };
    /// let weights = pool.alloc(128)?; // tagged `model` again: the inner scope has ended
    /// let by_tag = pool.memory_by_tag();
    /// assert_eq!((by_tag[&Some(model)], by_tag[&Some(optimizer)]), (128, 64));
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn enter(self) -> TagScope {
        let tag = self.0.get();
        // The list is bookkeeping: never in a pool. A thread whose list is gone (its
        // thread-locals are being destroyed) gets a scope that puts the tag before it back.
        let _bookkeeping = crate::thread::Bookkeeping::open();
        let number = SCOPES
            .try_with(|scopes| {
                let mut scopes = scopes.try_borrow_mut().ok()?;
                let number = scopes.last().map_or(0, |&(n, _)| n.wrapping_add(1));
                scopes.push((number, tag));
                Some(number)
            })
            .ok()
            .flatten();
        TagScope {
            number,
            previous: crate::thread::set_tag(tag),
            _not_send: std::marker::PhantomData,
        }
    }

    pub(in crate::pool) fn from_raw(raw: u32) -> Option<Self> {
        NonZeroU32::new(raw).map(Self)
    }
}

impl fmt::Debug for MemoryTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MemoryTag({:?})", self.name())
    }
}

impl fmt::Display for MemoryTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The scope of an [entered](MemoryTag::enter) tag. It stays on the thread that entered it
/// (it restores that thread's previous tag):
///
/// ```compile_fail
/// fn send<T: Send>(_: T) {}
/// send(ferropool::MemoryTag::new("weights").enter());
/// ```
///
/// ```
/// use ferropool::{BufferPool, MemoryTag};
/// let pool = BufferPool::new();
/// let scope = MemoryTag::new("scratch").enter();
/// let tagged = pool.alloc(64)?;
/// drop(scope); // buffers allocated from here on are untagged again
/// let untagged = pool.alloc(128)?;
/// assert_eq!(pool.memory_by_tag()[&None], 128);
/// # Ok::<(), ferropool::PoolError>(())
/// ```
#[derive(Debug)]
#[must_use = "the tag applies only while the scope lives"]
pub struct TagScope {
    /// Its entry in this thread's [`SCOPES`] (`None`: the thread keeps no list any more).
    number: Option<u64>,
    /// The thread's tag before it, put back if the list is gone when it drops.
    previous: u32,
    /// Not `Send`: the scope restores the tag of the thread that entered it.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for TagScope {
    fn drop(&mut self) {
        // The newest live scope's tag, from the list; without the list (gone with the
        // thread's thread-locals), the tag this scope replaced.
        let newest = self.number.and_then(|number| {
            let newest = SCOPES.try_with(|scopes| {
                let mut scopes = scopes.try_borrow_mut().ok()?;
                if let Some(at) = scopes.iter().rposition(|&(n, _)| n == number) {
                    scopes.remove(at);
                }
                Some(scopes.last().map_or(0, |&(_, tag)| tag))
            });
            newest.ok().flatten()
        });
        crate::thread::set_tag(newest.unwrap_or(self.previous));
    }
}

std::thread_local! {
    /// This thread's live tag scopes, oldest first: (number, tag), numbers rising. The
    /// thread's tag is the last one's (0 when empty). Thread-local: no other thread reads it.
    static SCOPES: std::cell::RefCell<Vec<(u64, u32)>> = const {
        std::cell::RefCell::new(Vec::new())
    };
}

/// Serialized as its name; deserializing gives the tag of that name (the one
/// [`MemoryTag::new`] gives: the same tag as every other of that name in the process).
#[cfg(feature = "serde")]
impl serde::Serialize for MemoryTag {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for MemoryTag {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Ok(MemoryTag::new(&name))
    }
}

/// Bytes in use (class sizes) per memory tag, as
/// [`BufferPool::memory_by_tag`](crate::BufferPool::memory_by_tag) reports them: an entry
/// per tag that holds memory, and one for untagged memory (`None`). Tags that hold nothing
/// have no entry, and read as 0.
///
/// ```
/// use ferropool::{BufferPool, MemoryTag};
/// let pool = BufferPool::new();
/// let weights = MemoryTag::new("weights");
/// let w = { let _scope = weights.enter(); pool.alloc(4096)? };
/// let scratch = pool.alloc(1000)?;
/// let by_tag = pool.memory_by_tag();
/// assert_eq!((by_tag.get(weights), by_tag.untagged(), by_tag.total()), (4096, 1024, 5120));
/// assert_eq!((by_tag[&Some(weights)], by_tag[&None]), (4096, 1024)); // indexing works too
/// assert_eq!(by_tag.get(MemoryTag::new("optimizer")), 0); // nothing held
/// # Ok::<(), ferropool::PoolError>(())
/// ```
///
/// With the `serde` feature it serializes as a map from each tag's name to its bytes, and
/// untagged memory under the key [`UNTAGGED_KEY`](Self::UNTAGGED_KEY) (`"untagged"`): in
/// JSON, an object with string keys. Names are unique (tags are interned by name), so no key
/// repeats: the bytes of a tag literally named `"untagged"`, if any, are added to the
/// untagged bytes under that one key. Deserializing reads the untagged key as untagged
/// memory and every other key as the tag of that name (made if it is new: a name read is
/// stored for the whole process, as [`MemoryTag::new`] stores it).
///
/// ```
/// # #[cfg(feature = "serde")] {
/// use ferropool::{BufferPool, MemoryByTag, MemoryTag};
/// let pool = BufferPool::new();
/// let kv = { let _scope = MemoryTag::new("kv-cache").enter(); pool.alloc(4096).unwrap() };
/// let scratch = pool.alloc(1000).unwrap();
/// let json = serde_json::to_string(&pool.memory_by_tag()).unwrap();
/// assert_eq!(json, r#"{"untagged":1024,"kv-cache":4096}"#);
/// let back: MemoryByTag = serde_json::from_str(&json).unwrap();
/// assert_eq!(back, pool.memory_by_tag());
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryByTag {
    /// Never a zero entry. Ordered: untagged first, then tags by when their name was made.
    bytes: BTreeMap<Option<MemoryTag>, u64>,
}

impl MemoryByTag {
    /// The key untagged memory has when serialized (feature `serde`): `"untagged"`.
    ///
    /// ```
    /// assert_eq!(ferropool::MemoryByTag::UNTAGGED_KEY, "untagged");
    /// ```
    pub const UNTAGGED_KEY: &'static str = "untagged";

    /// Bytes held by `tag` (a [`MemoryTag`], or `None` for untagged memory); 0 when it holds
    /// none.
    ///
    /// ```
    /// use ferropool::{BufferPool, MemoryTag};
    /// let pool = BufferPool::new();
    /// let grads = MemoryTag::new("grads");
    /// let g = { let _scope = grads.enter(); pool.alloc(64)? };
    /// let by_tag = pool.memory_by_tag();
    /// assert_eq!((by_tag.get(grads), by_tag.get(Some(grads)), by_tag.get(None)), (64, 64, 0));
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn get(&self, tag: impl Into<Option<MemoryTag>>) -> u64 {
        self.bytes.get(&tag.into()).copied().unwrap_or(0)
    }

    /// Bytes held by untagged buffers (`get(None)`).
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// let held = pool.alloc(1000)?;
    /// assert_eq!(pool.memory_by_tag().untagged(), 1024); // the class size
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn untagged(&self) -> u64 {
        self.get(None)
    }

    /// Bytes held in all, tagged or not.
    ///
    /// ```
    /// use ferropool::{BufferPool, MemoryTag};
    /// let pool = BufferPool::new();
    /// let a = { let _scope = MemoryTag::new("a").enter(); pool.alloc(64)? };
    /// let b = pool.alloc(128)?;
    /// assert_eq!(pool.memory_by_tag().total(), pool.stats().in_use_bytes);
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn total(&self) -> u64 {
        self.bytes
            .values()
            .fold(0, |total, &bytes| total.saturating_add(bytes))
    }

    /// Each tag that holds memory (`None` for untagged memory) with its bytes: untagged
    /// first, then tags in the order their names were first made.
    ///
    /// ```
    /// use ferropool::{BufferPool, MemoryTag};
    /// let pool = BufferPool::new();
    /// let (model, optimizer) = (MemoryTag::new("model"), MemoryTag::new("optimizer"));
    /// let m = { let _scope = model.enter(); pool.alloc(256)? };
    /// let o = { let _scope = optimizer.enter(); pool.alloc(64)? };
    /// let u = pool.alloc(64)?;
    /// let entries: Vec<_> = pool.memory_by_tag().iter().collect();
    /// assert_eq!(entries, [(None, 64), (Some(model), 256), (Some(optimizer), 64)]);
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (Option<MemoryTag>, u64)> + '_ {
        self.bytes.iter().map(|(&tag, &bytes)| (tag, bytes))
    }

    /// The number of entries: tags that hold memory, untagged memory counting as one.
    ///
    /// ```
    /// use ferropool::{BufferPool, MemoryTag};
    /// let pool = BufferPool::new();
    /// let tagged = {
    ///     let _scope = MemoryTag::new("a").enter();
    ///     [pool.alloc(64)?, pool.alloc(64)?]
    /// };
    /// let untagged = pool.alloc(64)?;
    /// assert_eq!(pool.memory_by_tag().len(), 2);
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether no memory is held at all.
    ///
    /// ```
    /// let pool = ferropool::BufferPool::new();
    /// assert!(pool.memory_by_tag().is_empty());
    /// let held = pool.alloc(1)?;
    /// assert!(!pool.memory_by_tag().is_empty());
    /// # Ok::<(), ferropool::PoolError>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Adds `bytes` to `tag`'s entry (none for 0 bytes).
    fn add(&mut self, tag: Option<MemoryTag>, bytes: u64) {
        if bytes != 0 {
            let entry = self.bytes.entry(tag).or_insert(0);
            *entry = entry.saturating_add(bytes);
        }
    }
}

/// Sums the bytes given for each tag (`None` for untagged memory).
///
/// ```
/// use ferropool::{MemoryByTag, MemoryTag};
/// let weights = MemoryTag::new("weights");
/// let by_tag: MemoryByTag = [(Some(weights), 64), (None, 8), (Some(weights), 64)]
///     .into_iter()
///     .collect();
/// assert_eq!((by_tag.get(weights), by_tag.untagged(), by_tag.len()), (128, 8, 2));
/// ```
impl FromIterator<(Option<MemoryTag>, u64)> for MemoryByTag {
    fn from_iter<I: IntoIterator<Item = (Option<MemoryTag>, u64)>>(entries: I) -> Self {
        let mut by_tag = Self::default();
        for (tag, bytes) in entries {
            by_tag.add(tag, bytes);
        }
        by_tag
    }
}

/// `by_tag[&Some(tag)]`, `by_tag[&None]`: as [`get`](MemoryByTag::get), 0 for a tag that
/// holds nothing (no panic).
///
/// ```
/// use ferropool::{BufferPool, MemoryTag};
/// let pool = BufferPool::new();
/// let held = pool.alloc(64)?;
/// let by_tag = pool.memory_by_tag();
/// assert_eq!((by_tag[&None], by_tag[&Some(MemoryTag::new("unused"))]), (64, 0));
/// # Ok::<(), ferropool::PoolError>(())
/// ```
impl Index<&Option<MemoryTag>> for MemoryByTag {
    type Output = u64;

    fn index(&self, tag: &Option<MemoryTag>) -> &u64 {
        self.bytes.get(tag).unwrap_or(&0)
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for MemoryByTag {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        // A tag named like the untagged key shares its entry: keys must not repeat.
        let untagged = self
            .bytes
            .iter()
            .filter(|(tag, _)| tag.is_none_or(|tag| tag.name() == Self::UNTAGGED_KEY))
            .fold(0u64, |total, (_, &bytes)| total.saturating_add(bytes));
        let tagged = || {
            self.bytes.iter().filter_map(|(tag, bytes)| {
                let name = (*tag)?.name();
                (name != Self::UNTAGGED_KEY).then_some((name, bytes))
            })
        };
        let len = tagged().count() + usize::from(untagged != 0);
        let mut map = serializer.serialize_map(Some(len))?;
        if untagged != 0 {
            map.serialize_entry(Self::UNTAGGED_KEY, &untagged)?;
        }
        for (name, bytes) in tagged() {
            map.serialize_entry(name, bytes)?;
        }
        map.end()
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for MemoryByTag {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;

        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = MemoryByTag;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map from memory tag names to bytes")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut entries: A,
            ) -> Result<MemoryByTag, A::Error> {
                let mut by_tag = MemoryByTag::default();
                while let Some((name, bytes)) =
                    entries.next_entry::<std::borrow::Cow<'de, str>, u64>()?
                {
                    let tag = (name != MemoryByTag::UNTAGGED_KEY).then(|| MemoryTag::new(&name));
                    by_tag.add(tag, bytes);
                }
                Ok(by_tag)
            }
        }

        deserializer.deserialize_map(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many times `name` is stored in the tag table.
    fn stored(name: &str) -> usize {
        names()
            .by_id
            .iter()
            .filter(|&&stored| stored == name)
            .count()
    }

    #[test]
    fn one_name_is_one_tag_stored_once() {
        let name = "tag-test: interned once";
        let made: Vec<MemoryTag> = (0..10_000).map(|_| MemoryTag::new(name)).collect();
        assert_eq!(
            stored(name),
            1,
            "a name is stored once, however often it is made"
        );
        let first = made[0];
        assert!(made.iter().all(|&tag| tag == first), "one name, one tag");
        let other = MemoryTag::new("tag-test: another name");
        assert_ne!(other, first);
        assert_eq!(
            (first.name(), other.name()),
            (name, "tag-test: another name")
        );
        let on_another_thread = std::thread::spawn(move || MemoryTag::new(name))
            .join()
            .unwrap();
        assert_eq!(on_another_thread, first);
    }

    #[cfg(feature = "serde")]
    #[test]
    fn a_deserialized_tag_is_the_interned_one() {
        let name = "tag-test: \"serde\"";
        let tag = MemoryTag::new(name);
        let json = serde_json::to_string(&tag).unwrap();
        let back: Vec<MemoryTag> = (0..100)
            .map(|_| serde_json::from_str(&json).unwrap())
            .collect();
        assert_eq!(stored(name), 1, "deserializing looks the name up");
        assert!(back.iter().all(|&back| back == tag), "the same tag back");
        let new: MemoryTag = serde_json::from_str("\"tag-test: first seen in JSON\"").unwrap();
        assert_eq!(new, MemoryTag::new("tag-test: first seen in JSON"));
    }
}
