package main

import (
	"encoding/json"
	"reflect"
	"strings"
	"time"
)

var durationType = reflect.TypeOf(time.Duration(0))

// secondsJSON is v as JSON with every time.Duration field written as
// NAME_seconds, a number of seconds, the way the API writes durations
// (age_seconds, duration_seconds), instead of encoding/json's nanoseconds.
// encoding/json does the encoding; this walks v's type beside the decoded
// result to find the duration fields by their JSON names.
func secondsJSON(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var g any
	if err := json.Unmarshal(b, &g); err != nil {
		return nil, err
	}
	return durationsToSeconds(reflect.TypeOf(v), g), nil
}

func durationsToSeconds(t reflect.Type, g any) any {
	if t == nil || g == nil {
		return g
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		if xs, ok := g.([]any); ok {
			for i := range xs {
				xs[i] = durationsToSeconds(t.Elem(), xs[i])
			}
		}
	case reflect.Map:
		if m, ok := g.(map[string]any); ok {
			for k, x := range m {
				m[k] = durationsToSeconds(t.Elem(), x)
			}
		}
	case reflect.Struct:
		if m, ok := g.(map[string]any); ok {
			structSeconds(t, m)
		}
	}
	return g
}

// structSeconds rewrites m, the JSON object of a struct of type t, in place.
func structSeconds(t reflect.Type, m map[string]any) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		ft := f.Type
		if f.Anonymous && name == "" {
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				structSeconds(ft, m) // promoted fields live in the same object
				continue
			}
		}
		if name == "" {
			name = f.Name
		}
		x, ok := m[name]
		if !ok {
			continue
		}
		if ft == durationType {
			if n, ok := x.(float64); ok {
				delete(m, name)
				m[name+"_seconds"] = n / float64(time.Second)
			}
			continue
		}
		m[name] = durationsToSeconds(ft, x)
	}
}
