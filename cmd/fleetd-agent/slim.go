//go:build !nodestore

package main

const nodeStores = false
