package ring

import (
	"reflect"
	"testing"
)

func TestRingKeepsTheLastItems(t *testing.T) {
	r := New[int](3)
	if got := r.List(); len(got) != 0 {
		t.Errorf("empty ring lists %v", got)
	}
	for i := 1; i <= 5; i++ {
		r.Add(i)
	}
	if got := r.List(); !reflect.DeepEqual(got, []int{3, 4, 5}) {
		t.Errorf("List = %v, want [3 4 5]", got)
	}
	if r.Total() != 5 {
		t.Errorf("Total = %d", r.Total())
	}
}

func TestRingSubscribers(t *testing.T) {
	r := New[int](10)
	fast, slow := r.Subscribe(10), r.Subscribe(1)
	for i := 0; i < 3; i++ {
		r.Add(i)
	}
	for i := 0; i < 3; i++ {
		if v := <-fast.C(); v != i {
			t.Errorf("fast got %d, want %d", v, i)
		}
	}
	if <-slow.C() != 0 || slow.Dropped() != 2 {
		t.Errorf("slow subscriber: dropped %d, want 2", slow.Dropped())
	}
	fast.Close()
	fast.Close()
	if _, ok := <-fast.C(); ok {
		t.Error("closed subscription still delivers")
	}
	r.Add(9) // no panic on a closed subscriber
}
