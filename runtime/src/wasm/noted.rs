//! A run's code as the host passes it to the guest's `run` export: lowered into the guest as a
//! `string`, and on the way a look at the guest's memory.
//!
//! The component model gives an embedder no handle on a component's core memory: a `Memory`
//! comes only from a core instance, which a component does not expose. The one place wasmtime
//! shows the host a component's memory is the canonical ABI's lowering context, which it hands
//! to each value it lowers into the guest. So runs pass their code as [`Noted`], a string
//! that, while wasmtime lowers it, shows the memory to its [`Noter`]: a session's interrupt
//! (`super::interrupt`) and the slot's reset (`super::slot`) note where it is. `Noted`
//! implements wasmtime's `ComponentType` and `Lower` by delegating to `str`; those traits'
//! methods are `#[doc(hidden)]` (they are what `#[derive(Lower)]` generates), which is why
//! wasmtime is pinned to one exact version here, and `tests/it/sessions.rs` exercises the
//! whole path on every build.

use std::mem::MaybeUninit;

use wasmtime::component::__internal::{
    CanonicalAbiInfo, InstanceType, InterfaceType, LowerContext,
};
use wasmtime::component::{ComponentType, Lower};

/// What looks at the guest's memory as a run's code is lowered into it.
pub(crate) trait Noter: Send + Sync {
    /// Called with the guest's whole memory, each time the code is lowered.
    fn note(&self, memory: &mut [u8]);
}

impl<A: Noter, B: Noter> Noter for (A, B) {
    fn note(&self, memory: &mut [u8]) {
        self.0.note(memory);
        self.1.note(memory);
    }
}

/// A run's code, which shows the guest's memory to `noter` as it is lowered.
pub(crate) struct Noted<N> {
    pub text: String,
    pub noter: N,
}

// SAFETY: `Noted` is lowered exactly as `str` is: the same flat representation and canonical
// ABI, checked against the same interface type.
unsafe impl<N: Noter> ComponentType for Noted<N> {
    type Lower = <str as ComponentType>::Lower;
    const ABI: CanonicalAbiInfo = <str as ComponentType>::ABI;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
        <str as ComponentType>::typecheck(ty, types)
    }
}

// SAFETY: as for `ComponentType`: every lowering is `str`'s, after the noter's look.
unsafe impl<N: Noter> Lower for Noted<N> {
    fn linear_lower_to_flat<T>(
        &self,
        cx: &mut LowerContext<'_, T>,
        ty: InterfaceType,
        dst: &mut MaybeUninit<Self::Lower>,
    ) -> wasmtime::Result<()> {
        self.noter.note(cx.as_slice_mut());
        self.text.as_str().linear_lower_to_flat(cx, ty, dst)
    }

    fn linear_lower_to_memory<T>(
        &self,
        cx: &mut LowerContext<'_, T>,
        ty: InterfaceType,
        offset: usize,
    ) -> wasmtime::Result<()> {
        self.noter.note(cx.as_slice_mut());
        self.text.as_str().linear_lower_to_memory(cx, ty, offset)
    }
}
