//! What a handler reports.

/// The outcome of an `#[idempotent]` handler that did not fail.
///
/// Both variants mean the message may be acknowledged to the broker. A
/// handler with `store_result` returns [`Stored`] instead.
///
/// ```
/// use diesel_inbox::Processed;
///
/// let first: Processed<i64> = Processed::Applied(40);
/// let again: Processed<i64> = Processed::Duplicate;
/// assert_eq!(first.map(|v| v + 2).applied(), Some(42));
/// assert!(again.is_duplicate());
/// ```
#[must_use = "a handler's outcome says whether the body ran; acknowledge the message either way"]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Processed<T> {
    /// First delivery: the body ran and its transaction committed with the inbox row.
    Applied(T),
    /// The key was already in the inbox for this consumer: the body did not run.
    Duplicate,
}

impl<T> Processed<T> {
    /// `true` for [`Processed::Applied`].
    ///
    /// ```
    /// assert!(diesel_inbox::Processed::Applied(()).is_applied());
    /// ```
    pub fn is_applied(&self) -> bool {
        matches!(self, Processed::Applied(_))
    }

    /// `true` for [`Processed::Duplicate`].
    ///
    /// ```
    /// assert!(diesel_inbox::Processed::<()>::Duplicate.is_duplicate());
    /// ```
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Processed::Duplicate)
    }

    /// The body's value, if it ran.
    ///
    /// ```
    /// assert_eq!(diesel_inbox::Processed::Applied(3).applied(), Some(3));
    /// ```
    pub fn applied(self) -> Option<T> {
        match self {
            Processed::Applied(value) => Some(value),
            Processed::Duplicate => None,
        }
    }

    /// Maps the applied value.
    ///
    /// ```
    /// use diesel_inbox::Processed;
    /// assert_eq!(Processed::Applied(2).map(|v| v * 2), Processed::Applied(4));
    /// ```
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Processed<U> {
        match self {
            Processed::Applied(value) => Processed::Applied(f(value)),
            Processed::Duplicate => Processed::Duplicate,
        }
    }
}

/// The outcome of an `#[idempotent(store_result)]` handler that did not
/// fail: [`Processed`], with the value the first delivery stored.
///
/// Both variants mean the message may be acknowledged to the broker. The
/// value is stored as JSON in the inbox row's `result` column, in the
/// transaction of the body (feature `serde`; the success type is
/// `Serialize + DeserializeOwned`). A stored value that no longer
/// deserializes (the type changed since) is
/// [`InboxError::StoredResultUnreadable`](crate::InboxError::StoredResultUnreadable).
///
/// ```
/// use diesel_inbox::Stored;
///
/// let first: Stored<u32> = Stored::Applied(7);
/// let again: Stored<u32> = Stored::Duplicate(Some(7));
/// assert_eq!(first.value(), again.value());
/// assert!(again.is_duplicate());
/// assert_eq!(Stored::<u32>::Duplicate(None).value(), None);
/// ```
#[must_use = "a handler's outcome says whether the body ran; acknowledge the message either way"]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stored<T> {
    /// First delivery: the body ran, and its value was committed with the
    /// inbox row.
    Applied(T),
    /// The key was already in the inbox for this consumer: the body did not
    /// run. `Some`: the value its first delivery stored; `None`: its row
    /// holds none (written by a handler without `store_result`, or before
    /// the schema upgrade).
    Duplicate(Option<T>),
}

impl<T> Stored<T> {
    /// `true` for [`Stored::Applied`].
    ///
    /// ```
    /// assert!(diesel_inbox::Stored::Applied(()).is_applied());
    /// ```
    pub fn is_applied(&self) -> bool {
        matches!(self, Stored::Applied(_))
    }

    /// `true` for [`Stored::Duplicate`].
    ///
    /// ```
    /// assert!(diesel_inbox::Stored::<()>::Duplicate(None).is_duplicate());
    /// ```
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Stored::Duplicate(_))
    }

    /// The value: this delivery's, or the one the first delivery stored.
    ///
    /// ```
    /// assert_eq!(diesel_inbox::Stored::Duplicate(Some(3)).value(), Some(3));
    /// ```
    pub fn value(self) -> Option<T> {
        match self {
            Stored::Applied(value) | Stored::Duplicate(Some(value)) => Some(value),
            Stored::Duplicate(None) => None,
        }
    }

    /// The [`Processed`] outcome, without the stored value.
    ///
    /// ```
    /// use diesel_inbox::{Processed, Stored};
    /// assert_eq!(Stored::Duplicate(Some(3)).processed(), Processed::Duplicate);
    /// ```
    pub fn processed(self) -> Processed<T> {
        match self {
            Stored::Applied(value) => Processed::Applied(value),
            Stored::Duplicate(_) => Processed::Duplicate,
        }
    }
}

/// The outcome of a batch handler that did not fail: every message of the
/// batch may be acknowledged.
///
/// ```
/// use diesel_inbox::Batch;
///
/// let batch = Batch { value: Some(2), applied: vec![0, 2], duplicates: 1 };
/// assert_eq!(batch.applied.len() + batch.duplicates, 3);
/// ```
#[must_use = "a batch outcome says which messages the body applied; acknowledge them all either way"]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch<T> {
    /// What the body returned, or `None` when every message was a duplicate
    /// (the body did not run).
    pub value: Option<T>,
    /// Positions, in the handler's input, of the messages the body received
    /// and applied (first deliveries), in input order.
    pub applied: Vec<usize>,
    /// How many messages were not passed to the body: already in the inbox,
    /// or a repeat of an earlier key in the same batch.
    pub duplicates: usize,
}

mod sealed {
    /// The seal of [`Outcome`](super::Outcome).
    pub trait Sealed {}
}

impl<T> sealed::Sealed for Processed<T> {}
impl<T> sealed::Sealed for Stored<T> {}
impl<T> sealed::Sealed for Batch<T> {}

/// What every handler returns on success, [`Processed<T>`], [`Stored<T>`]
/// or [`Batch<T>`], as code that consumes outcomes (the broker glue,
/// metrics of your own) reads it: whether the body ran.
///
/// ```
/// use diesel_inbox::{Batch, Outcome, Processed, Stored};
///
/// fn label(outcome: &impl Outcome) -> &'static str {
///     if outcome.is_applied() { "applied" } else { "duplicate" }
/// }
/// assert_eq!(label(&Processed::Applied(1)), "applied");
/// assert_eq!(label(&Stored::Duplicate(Some(1))), "duplicate");
/// assert_eq!(label(&Batch::<()> { value: None, applied: vec![], duplicates: 2 }), "duplicate");
/// ```
pub trait Outcome: sealed::Sealed {
    /// Whether the body ran and committed (for a batch: for at least one
    /// of its messages).
    fn is_applied(&self) -> bool;

    /// Whether the body did not run: everything was done before.
    fn is_duplicate(&self) -> bool {
        !self.is_applied()
    }
}

impl<T> Outcome for Processed<T> {
    fn is_applied(&self) -> bool {
        matches!(self, Processed::Applied(_))
    }
}

impl<T> Outcome for Stored<T> {
    fn is_applied(&self) -> bool {
        matches!(self, Stored::Applied(_))
    }
}

impl<T> Outcome for Batch<T> {
    fn is_applied(&self) -> bool {
        self.value.is_some()
    }
}
