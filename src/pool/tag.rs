//! Memory tags: names a caller gives to what its buffers are for (a checkpoint chain, a
//! model's weights), so that a pool's snapshot can say how much memory each holds.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::{Mutex, PoisonError};

/// The names of the tags made so far; tag `n` is `NAMES[n - 1]`. Bookkeeping outside any
/// concurrency protocol.
static NAMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

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
/// assert_eq!(by_tag.get(&Some(activations)), Some(&(1 << 20)));
/// # drop(held);
/// # Ok::<(), ferropool::PoolError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemoryTag(NonZeroU32);

impl MemoryTag {
    /// A new tag named `name` (names need not be unique; each call makes a distinct tag).
    ///
    /// ```
    /// use ferropool::MemoryTag;
    /// let (a, b) = (MemoryTag::new("weights"), MemoryTag::new("weights"));
    /// assert_ne!(a, b); // same name, distinct tags
    /// assert_eq!(a.name(), b.name());
    /// ```
    pub fn new(name: &str) -> Self {
        let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
        // Tags live for the whole process, as their names do.
        names.push(Box::leak(name.to_owned().into_boxed_str()));
        let id = u32::try_from(names.len()).expect("fewer than 2^32 tags");
        Self(NonZeroU32::new(id).expect("ids start at 1"))
    }

    /// The tag's name.
    ///
    /// ```
    /// let grads = ferropool::MemoryTag::new("grads");
    /// assert_eq!(grads.name(), "grads");
    /// assert_eq!(grads.to_string(), "grads"); // `Display` shows the name too
    /// ```
    pub fn name(&self) -> &'static str {
        NAMES.lock().unwrap_or_else(PoisonError::into_inner)[self.0.get() as usize - 1]
    }

    /// Tags the buffers this thread allocates until the returned scope drops (scopes nest:
    /// dropping one restores the tag that was current before).
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
        TagScope {
            previous: crate::thread::set_tag(self.0.get()),
            _not_send: std::marker::PhantomData,
        }
    }

    pub(super) fn from_raw(raw: u32) -> Option<Self> {
        NonZeroU32::new(raw).map(Self)
    }
}

/// The tag of buffers allocated now on this thread (0 for none).
#[inline(always)]
pub(super) fn current() -> u32 {
    crate::thread::tag()
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
    previous: u32,
    /// Not `Send`: the scope restores the tag of the thread that entered it.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for TagScope {
    fn drop(&mut self) {
        crate::thread::set_tag(self.previous);
    }
}

/// Serialized as its name; deserializing makes a new tag of that name (tags are distinct per
/// process, names need not be).
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
